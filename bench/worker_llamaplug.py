#!/usr/bin/env python3
"""One measurement round of llamaplug, in its own process (bench/run.py starts it).

    python bench/worker_llamaplug.py MODEL.gguf WORKLOAD_JSON

Prints one result line (see _shared.emit). Phases: import + load (RSS after
load), warm-up, prompt processing and generation through Llama.create_completion,
the mid-level loop (LlamaContext.eval + SamplerChain.sample + decode_single) with
the time inside llama_decode separated from Python, and the batched test
(one LlamaBatch decode per step for all sequences of a context with n_seq_max=16).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import PP_TEXT, TG_TEXT, Timer, Workload, count_text, emit, fit, mib, status_kb, token_digest  # noqa: E402


class DecodeTimer:
    """Times every llama_decode llamaplug's context module makes, by swapping in a proxy of its `lib`."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self._module = None

    def install(self) -> bool:
        try:
            from llamaplug.blocks import context as module
        except ImportError:
            return False
        real = getattr(module, "lib", None)
        if real is None or not hasattr(real, "llama_decode"):
            return False
        calls, pc, decode = self.calls, time.perf_counter, real.llama_decode
        calls.clear()

        class Proxy:
            def __getattr__(self, name: str):
                value = getattr(real, name)
                setattr(self, name, value)  # later lookups are plain attribute hits
                return value

            @staticmethod
            def llama_decode(ctx, batch):
                t0 = pc()
                rc = decode(ctx, batch)
                calls.append(pc() - t0)
                return rc

        self._module, self._real = module, real
        module.lib = Proxy()
        return True

    def uninstall(self) -> None:
        if self._module is not None:
            self._module.lib = self._real
            self._module = None


def main() -> None:
    model_path, w = sys.argv[1], Workload.from_json(sys.argv[2])
    out: dict = {"impl": "llamaplug"}
    with Timer() as t_import:
        import llamaplug as lp
    out["version"] = f"{lp.__version__} (llama.cpp {lp.LLAMA_CPP_COMMIT})"
    out["import_ms"] = t_import.ms

    params = lp.LlamaParams(model_path, n_ctx=w.n_ctx, n_threads=w.threads, n_threads_batch=w.threads,
                            backends=[w.backend], n_gpu_layers="all" if w.backend != "cpu" else "auto")
    with Timer() as t_backend:  # plugin discovery, probes, backend modules (Llama.load's first step)
        lp.LlamaBackend.init()
    with Timer() as t_load:
        llama = lp.Llama.load(params)
    out["backend_init_ms"] = t_backend.ms
    out["load_ms"] = t_backend.ms + t_load.ms  # the whole of Llama.load in a fresh process
    out["rss_after_load_mib"] = mib(status_kb("VmRSS"))
    # llama.cpp's t_load runs from the start of the model load to the end of the first decode:
    # read it after a tiny first completion, as llama-completion's warm-up does.
    tg_tokens = llama.tokenize(TG_TEXT)
    with Timer() as t_first:
        llama.create_completion(tg_tokens, max_tokens=1)
    out["first_token_ms"] = out["load_ms"] + t_first.ms
    out["hwm_first_token_mib"] = mib(status_kb("VmHWM"))
    out["startup_ms"] = out["import_ms"] + out["first_token_ms"]
    out["llama_t_load_ms"] = llama.context.perf()["t_load_ms"]
    from llamaplug.raw import ffi, lib

    out["system_info"] = ffi.string(lib.llama_print_system_info()).decode()

    model, ctx = llama.model, llama.context
    pp_tokens = fit(llama.tokenize(PP_TEXT), w.pp, "prompt-processing")
    out["digests"] = {"pp": token_digest(pp_tokens), "tg": token_digest(tg_tokens)}

    from llamaplug.bench import batched_rates, complete_greedy, generation_rate, prompt_rate

    def complete(tokens: list[int], n: int) -> lp.Completion:
        return complete_greedy(llama, tokens, n)

    if w.warmup:  # llama-bench warms up each test with one run; so do we
        complete(pp_tokens, 1)
        complete(tg_tokens, 4)
    out["hwm_after_warmup_mib"] = mib(status_kb("VmHWM"))
    # The same measurements as `llamaplug bench`: through create_completion, fastest of w.inner.
    out["pp"] = prompt_rate(llama, pp_tokens, w.inner)
    out["tg"] = generation_rate(llama, tg_tokens, w.tg, w.inner)

    # The same again with llama_decode timed (a shim around the module's cffi lib): the Python
    # overhead is the generation time not spent inside llama_decode. Kept out of the tps runs.
    shim = DecodeTimer()
    if shim.install():
        try:
            c = complete(tg_tokens, w.tg)
        finally:
            shim.uninstall()
        gen_decode_s = sum(shim.calls[1:])  # calls[0] is the prompt
        k = c.timings.predicted_tokens
        out["tg"]["in_decode_us_per_token"] = 1e6 * gen_decode_s / max(len(shim.calls) - 1, 1)
        out["tg"]["overhead_us_per_token"] = (1e3 * c.timings.predicted_ms - 1e6 * gen_decode_s) / k if k else 0.0

    # -- mid-level loop: eval the prompt, then sample + decode_single
    # on the engine's thread, where create_completion decoded: a second thread's decodes would give OpenMP a
    # second team and slow both (llamaplug/high/engine.py)
    def mid_level() -> dict:
        pc = time.perf_counter
        n = w.tg
        with lp.SamplerChain().greedy() as sampler:
            def mid_loop() -> float:
                ctx.clear_cache()
                ctx.eval(tg_tokens, 0)
                t0 = pc()
                for _ in range(n):
                    ctx.decode_single(sampler.sample(ctx, -1))
                return pc() - t0

            mid_loop()  # builds the native chain outside the timed runs
            loop_s = min(mid_loop() for _ in range(w.inner))
            mid = {"tokens": n, "loop_ms": loop_s * 1e3, "tps": n / loop_s}
            if shim.install():
                try:
                    shim_s = mid_loop()
                finally:
                    shim.uninstall()
                in_decode = sum(shim.calls[1:])
                mid.update({"in_decode_us_per_token": 1e6 * in_decode / n,
                            "overhead_us_per_token": 1e6 * (shim_s - in_decode) / n})

            # The same loop straight through cffi, no llamaplug code: the floor of a Python loop.
            ctx.clear_cache()
            ctx.eval(tg_tokens, 0)
            raw_chain, raw_ctx = sampler._ptr, ctx._ptr
            one = lp.LlamaBatch(1, 1)
            one.add(0, 0, (0,), True)
            c_batch = one.c_batch()
            sample_fn, decode_fn = lib.llama_sampler_sample, lib.llama_decode
            tok_arr, pos_arr = one.token, one.pos
            pos = len(tg_tokens)
            in_decode = 0.0
            t0 = pc()
            for _ in range(n):
                tok_arr[0] = sample_fn(raw_chain, raw_ctx, -1)
                pos_arr[0] = pos
                a = pc()
                if decode_fn(raw_ctx, c_batch):
                    raise RuntimeError("llama_decode failed")
                in_decode += pc() - a
                pos += 1
            raw_s = pc() - t0
            # greedy sampling alone, through the wrapper and bare (it scans the whole vocabulary in C)
            k = 200
            a = pc()
            for _ in range(k):
                sampler.sample(ctx, -1)
            b = pc()
            for _ in range(k):
                sample_fn(raw_chain, raw_ctx, -1)
            c_ = pc()
            for _ in range(k):  # what greedy needs at least: an argmax over the logits view
                int(ctx.get_logits_ith(-1).argmax())
            mid.update({"raw_loop_ms": raw_s * 1e3, "raw_tps": n / raw_s,
                        "raw_in_decode_us_per_token": 1e6 * in_decode / n,
                        "raw_overhead_us_per_token": 1e6 * (raw_s - in_decode) / n,
                        "sample_us": 1e6 * (b - a) / k, "raw_sample_us": 1e6 * (c_ - b) / k,
                        "argmax_us": 1e6 * (pc() - c_) / k})
            ctx.clear_cache()
            return mid

    out["mid"] = llama.engine.call(mid_level)

    # -- batched: n sequences in one context, one decode per step for all of them
    if w.batch_npl:
        prompts = [fit(model.tokenize(count_text(100 * s + 1)), w.batch_npp, "batched")
                   for s in range(max(w.batch_npl))]
        out["digests"]["batch"] = token_digest([t for p in prompts for t in p])
        out["batched"] = llama.engine.call(lambda: batched_rates(model, prompts, list(w.batch_npl), w.batch_ntg,
                                                                  w.batch_n_ctx, w.threads, w.inner))
    out["hwm_end_mib"] = mib(status_kb("VmHWM"))
    llama.close()
    emit(out)


if __name__ == "__main__":
    main()
