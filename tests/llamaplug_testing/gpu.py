"""Shared by the GPU backend tests: one generation per fresh interpreter, and the comparison with CPU.

The backend set is fixed per process and a driver crash must fail a test, not kill
pytest, so every run is a child process that prints one JSON result.
"""

from __future__ import annotations

import json
import textwrap
import time

import numpy as np

from .child import run_isolated

# Teacher forcing: one batch decode of this text with logits for every position.
TEXT = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
        "It is named after the engineer Gustave Eiffel, whose company designed and built the tower.")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]
CHILD_TIMEOUT = 900

CHILD = textwrap.dedent("""
    import dataclasses, json, logging, sys, time
    import numpy as np
    import llamaplug as lp

    args = json.loads(sys.argv[1])
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("llamaplug.native").addHandler(handler)
    out = {}
    t0 = time.monotonic()
    params = lp.LlamaParams(model_path=args["model"], n_ctx=256, n_threads=2, log_level="info", **args["params"])
    with lp.Llama.load(params) as llama:
        out["load_s"] = time.monotonic() - t0
        out["backends"] = [dataclasses.asdict(s) for s in llama.backend.backends()]
        out["devices"] = [dataclasses.asdict(d) for d in llama.backend.devices()]
        if args["text"]:
            tokens = llama.tokenize(args["text"])
            batch = lp.LlamaBatch(len(tokens), 1)
            batch.add_sequence(tokens, logits_all=True)
            llama.context.clear_cache()
            t0 = time.monotonic()
            llama.context.decode(batch)
            logits = np.array(llama.context.get_logits())  # waits for the (asynchronous) compute
            out["decode_s"] = time.monotonic() - t0
            np.save(args["logits"], logits)
            out["tokens"] = tokens
        t0 = time.monotonic()
        out["completions"] = [
            llama.create_completion(p, max_tokens=args["max_tokens"], sampler=lp.SamplerChain().greedy()).tokens
            for p in args["prompts"]
        ]
        out["completion_s"] = time.monotonic() - t0
        fit = llama.model.fit
        out["fit"] = None if fit is None else {
            **{f.name: getattr(fit, f.name) for f in dataclasses.fields(fit) if f.name != "context"},
            "n_ctx": fit.n_ctx}
    out["log"] = lines
    print("RESULT " + json.dumps(out))
""")


def child_env(**changes: str | None) -> dict[str, str | None]:
    """run_isolated's env: no backend or device selection inherited from this process, and `changes`."""
    return {**dict.fromkeys(("LLAMAPLUG_BACKENDS", "GGML_VK_VISIBLE_DEVICES", "VK_ICD_FILENAMES", "VK_DRIVER_FILES",
                              "CUDA_VISIBLE_DEVICES")), **{k: v for k, v in changes.items() if v is not None}}


def run_child(model, env: dict[str, str | None], *, text: str = "", logits: str = "", prompts=PROMPTS,
              max_tokens: int = 1, params: dict | None = None) -> dict:
    args = {"model": str(model), "text": text, "logits": logits, "prompts": prompts, "max_tokens": max_tokens,
            "params": params or {}}
    t0 = time.monotonic()
    result = run_isolated(CHILD, json.dumps(args), env=env, timeout=CHILD_TIMEOUT, result=True)
    result["wall_s"] = time.monotonic() - t0
    return result


def status(result: dict, name: str) -> dict:
    found = [s for s in result["backends"] if s["name"] == name]
    assert found, f"no {name} backend in {result['backends']}"
    return found[0]


def offloaded_layers(result: dict) -> tuple[int, int]:
    line = next(ln for ln in result["log"] if "offloaded" in ln and "layers to GPU" in ln)
    done, total = line.split("offloaded ")[1].split(" layers")[0].split("/")
    return int(done), int(total)


def assert_agrees_with_cpu(gpu: dict, cpu: dict, gpu_logits, cpu_logits, label: str) -> None:
    """Teacher-forced next-token predictions agree on >= 95 % of positions, logits close, first tokens equal."""
    assert gpu["tokens"] == cpu["tokens"] and 30 <= len(cpu["tokens"]) <= 48, len(cpu["tokens"])
    a, b = np.load(gpu_logits), np.load(cpu_logits)
    assert a.shape == b.shape == (len(cpu["tokens"]), a.shape[1])
    gpu_top, cpu_top = a.argmax(axis=1), b.argmax(axis=1)
    rows = np.arange(len(b))
    agree = float(np.mean(gpu_top == cpu_top))
    # Where they differ, the GPU's choice must be a near-tie on the CPU too (other float paths).
    cpu_gap = b[rows, cpu_top] - b[rows, gpu_top]
    diff = np.abs(a - b)
    max_diff, mean_diff, spread = float(diff.max()), float(diff.mean()), float(np.abs(b).max())
    corr = min(float(np.corrcoef(x, y)[0, 1]) for x, y in zip(a, b))
    print(f"\n{label} vs cpu: {len(b)} positions, argmax agreement {agree:.3f} (largest CPU gap where they differ "
          f"{cpu_gap.max():.3f}), |logit diff| max {max_diff:.3f} mean {mean_diff:.3f} (logits up to {spread:.1f}), "
          f"min correlation {corr:.5f}; batch decode {gpu['decode_s']:.2f} s vs {cpu['decode_s']:.2f} s; "
          f"child wall {gpu['wall_s']:.1f} s vs {cpu['wall_s']:.1f} s")
    assert agree >= 0.95, (agree, max_diff)
    assert cpu_gap.max() < 0.5, cpu_gap
    assert corr > 0.995 and mean_diff < 0.02 * spread and max_diff < 0.1 * spread, (corr, mean_diff, max_diff, spread)
    assert [c[0] for c in gpu["completions"]] == [c[0] for c in cpu["completions"]], (gpu["completions"],
                                                                                      cpu["completions"])
