"""RPC on loopback: layers placed on a server's device give the same greedy tokens as local CPU."""

from __future__ import annotations

import json
import textwrap

import pytest
from llamaplug_testing import run_isolated

PROMPT = "The capital of France is"


def generate(model: str, rpc: list[str]) -> dict:
    code = textwrap.dedent(f"""
        import json, logging
        import llamaplug as lp
        lines = []
        handler = logging.Handler()
        handler.emit = lambda record: lines.append(record.getMessage())
        logging.getLogger("llamaplug.native").addHandler(handler)
        params = lp.LlamaParams(model_path={model!r}, n_ctx=512, n_threads=2, rpc_servers={rpc!r},
                                log_level="info")
        with lp.Llama.load(params) as llama:
            out = llama.create_completion({PROMPT!r}, max_tokens=24, sampler=lp.SamplerChain().greedy())
        print(json.dumps({{"tokens": out.tokens, "log": lines}}))
    """)
    done = run_isolated(code, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_rpc_layers_give_cpu_tokens(rpc_server, smollm2_path):
    remote = generate(str(smollm2_path), [rpc_server])
    local = generate(str(smollm2_path), [])
    assert any(f"RPC0[{rpc_server}] model buffer size" in line for line in remote["log"]), remote["log"][-20:]
    assert any("offloaded 31/31 layers to GPU" in line for line in remote["log"])
    assert not any("RPC0" in line for line in local["log"])
    assert len(remote["tokens"]) == 24
    assert remote["tokens"] == local["tokens"]


def test_bad_rpc_endpoint_is_a_clear_error(smollm2_path):
    import llamaplug as lp

    with pytest.raises(lp.InvalidParameterError, match="host:port"):
        lp.Llama.load(lp.LlamaParams(model_path=smollm2_path, rpc_servers=["no-port-here"]))
