"""A/B of generation inside llama_decode: 128 decode_single steps (+ the logits view) per round, best of 3.

Usage: python bench/decode_ab.py MODEL.gguf [default|noabort|nopool] [ContextParams overrides as k=v ...]
Written for the first GPU run (docs/benchmarks.md, "CUDA on an H100"): every layer offloaded, and llama.cpp's own
counters (evals, reused graphs, eval time) printed beside the rate, so a variant's effect shows where it acts.
"""

from __future__ import annotations

import ast
import sys
import time

import llamaplug as lp
from llamaplug.blocks import _threadpool, c_params, context


def main(argv: list[str]) -> None:
    model_path, variant, overrides = argv[0], argv[1] if len(argv) > 1 else "default", argv[2:]
    if variant == "noabort":
        made = c_params.context_c_params

        def without_abort(p, flag=None):
            c = made(p, flag)
            c.abort_callback = lp.raw.ffi.NULL
            return c

        context.context_c_params = without_abort
    elif variant == "nopool":
        _threadpool.ThreadPools.attach = lambda self, ctx: None
    given = {k: ast.literal_eval(v) for k, v in (o.split("=", 1) for o in overrides)}
    lp.LlamaBackend.init()
    model = lp.LlamaModel(model_path, lp.ModelParams(n_gpu_layers="all"))
    ctx = lp.LlamaContext(model, lp.ContextParams(**{"n_ctx": 2048, "n_threads": 8, **given}))
    prompt = model.tokenize("The capital of France is")
    batch = lp.LlamaBatch(512, 1)
    batch.add_sequence(prompt, seq_id=0)
    ctx.decode(batch)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(128):
            ctx.decode_single(prompt[-1])
            ctx.get_logits_ith(-1)[0]  # reading an output waits for the device
        best = min(best, time.perf_counter() - t0)
    perf = lp.raw.lib.llama_perf_context(ctx._ptr)
    print(f"{variant} {given or ''} {128 / best:.0f} t/s; n_eval {perf.n_eval} n_reused {perf.n_reused} "
          f"t_eval_ms {perf.t_eval_ms:.0f}")


if __name__ == "__main__":
    main(sys.argv[1:])
