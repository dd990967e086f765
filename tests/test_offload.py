"""Offload parameters: n_gpu_layers="auto" (llama.cpp's fitting) and devices=[...].

No GPU here, so the device is a loopback RPC server: a real ggml device with its
own memory report, which llama.cpp's fitting and device selection treat like a GPU.
Each load runs in a child process, because RPC servers join a process for good.
"""

from __future__ import annotations

import textwrap

import pytest
from llamaplug_testing import run_isolated

import llamaplug as lp

PROMPT = "The capital of France is"
N_LAYERS = 31  # SmolLM2-135M: 30 blocks + the output layer


def child(model: str, rpc: str, body: str) -> dict:
    """Run `body` with `params(**kw)` and `device` (the RPC device's DeviceInfo); it sets `out`."""
    code = textwrap.dedent(f"""
        import json, logging
        import llamaplug as lp
        lines = []
        handler = logging.Handler()
        handler.emit = lambda record: lines.append(record.getMessage())
        logging.getLogger("llamaplug.native").addHandler(handler)
        backend = lp.LlamaBackend.init()
        backend.add_rpc_server({rpc!r})
        device = next(d for d in backend.devices() if d.name.startswith("RPC"))
        def params(**kw):
            return lp.LlamaParams(model_path={model!r}, n_ctx=512, n_threads=2, rpc_servers=[{rpc!r}],
                                  log_level="info", **kw)
        def generate(**kw):
            with lp.Llama.load(params(**kw)) as llama:
                tokens = llama.create_completion({PROMPT!r}, max_tokens=16, sampler=lp.SamplerChain().greedy()).tokens
                return tokens, llama.model.fit
        out = {{}}
    """) + textwrap.dedent(body) + "\nprint('RESULT', json.dumps(out, default=str))\n"
    return run_isolated(code, timeout=600, result=True)


def offloaded(log: list[str]) -> int:
    line = next(x for x in log if "layers to GPU" in x and "offloaded" in x)
    return int(line.split("offloaded ")[1].split("/")[0])


def test_auto_fits_layers_to_the_device_memory_it_leaves_free(smollm2_path, rpc_server):
    # Leave free all but 180 MiB of the device: weights (92 MiB), KV cache and the compute buffer
    # (about 240 MiB in all here) cannot all go there, so llama.cpp's fit must choose a part of
    # the layers (22 of 31 when measured); the rest run on the CPU.
    out = child(str(smollm2_path), rpc_server, """
        free_mib = device.memory_free // 2**20
        tokens, fit = generate(n_gpu_layers="auto", fit_target_mib=[free_mib - 180])
        out["auto"] = {"tokens": tokens, "fit": fit.__dict__, "log": lines[:]}
        lines.clear()
        tokens, fit = generate(n_gpu_layers="auto")  # the default 1 GiB margin: everything fits
        out["roomy"] = {"tokens": tokens, "fit": fit.__dict__, "log": lines[:]}
        lines.clear()
        tokens, fit = generate(n_gpu_layers=0)
        out["cpu"] = {"tokens": tokens, "fit": fit, "log": lines[:]}
    """)
    auto, roomy, cpu = out["auto"], out["roomy"], out["cpu"]
    assert auto["fit"]["status"] == "fitted"
    assert 0 < auto["fit"]["n_gpu_layers"] < N_LAYERS, auto["fit"]
    assert offloaded(auto["log"]) == auto["fit"]["n_gpu_layers"]
    assert roomy["fit"]["status"] == "fitted" and offloaded(roomy["log"]) == N_LAYERS
    assert cpu["fit"] is None and offloaded(cpu["log"]) == 0  # an explicit count is not fitted
    assert len(cpu["tokens"]) == 16
    assert auto["tokens"] == cpu["tokens"] == roomy["tokens"]


def test_devices_picks_the_offload_devices_by_name(smollm2_path, rpc_server):
    out = child(str(smollm2_path), rpc_server, """
        tokens, _ = generate(n_gpu_layers="all", devices=[device.name])
        out["named"] = {"tokens": tokens, "log": lines[:]}
        lines.clear()
        tokens, _ = generate(n_gpu_layers="all", devices=[])
        out["none"] = {"tokens": tokens, "log": lines[:]}
        for name in ("NoSuchGPU", "CPU"):
            try:
                lp.Llama.load(params(devices=[name]))
            except lp.InvalidParameterError as exc:
                out[name] = [str(exc), exc.field]
        out["device"] = device.name
    """)
    assert offloaded(out["named"]["log"]) == N_LAYERS
    assert any(f"{out['device']} model buffer size" in x or "RPC0[" in x for x in out["named"]["log"])
    # (llama.cpp's "offloaded N/31 layers" line counts what was asked, even with no device to put it on.)
    assert not any("RPC0[" in x and "buffer size" in x for x in out["none"]["log"])
    assert any("CPU_Mapped model buffer size" in x for x in out["none"]["log"])
    assert out["named"]["tokens"] == out["none"]["tokens"]
    message, field = out["NoSuchGPU"]
    assert field == "devices" and "'NoSuchGPU': no such device" in message and out["device"] in message
    message, field = out["CPU"]
    assert field == "devices" and "CPU is always used" in message


def test_auto_without_offload_devices_sizes_only_a_context_left_to_it(smollm2_path):
    with lp.Llama.load(lp.LlamaParams(model_path=smollm2_path, n_ctx=0, n_threads=2, devices=[])) as llama:
        fit = llama.model.fit
        assert fit is not None and fit.status == "fitted"
        assert fit.n_ctx == llama.model.n_ctx_train == llama.context.n_ctx == 8192  # fits in host memory as is
        assert fit.n_gpu_layers == -1 and fit.tensor_split == ()
    with lp.Llama.load(lp.LlamaParams(model_path=smollm2_path, n_ctx=1024, n_threads=2, devices=[])) as llama:
        assert llama.model.fit is None  # nothing the fit could change
        assert llama.context.n_ctx == 1024


@pytest.mark.parametrize("bad", [-2, "some", 1.5, "AUTO"])
def test_bad_n_gpu_layers_is_an_invalid_parameter(bad):
    with pytest.raises(lp.InvalidParameterError) as info:
        lp.LlamaParams(model_path="x.gguf", n_gpu_layers=bad)
    assert info.value.field == "n_gpu_layers"


def test_bad_fit_target_is_an_invalid_parameter():
    for bad in ([], [-1], "lots"):
        with pytest.raises(lp.InvalidParameterError) as info:
            lp.ModelParams(fit_target_mib=bad)
        assert info.value.field and info.value.field.startswith("fit_target_mib")
    assert lp.ModelParams(fit_target_mib=512).fit_target_mib == [512]
