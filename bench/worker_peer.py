#!/usr/bin/env python3
"""One measurement round of the peer, llama-cpp-python, in its own process and venv.

    <peer venv>/bin/python bench/worker_peer.py MODEL.gguf WORKLOAD_JSON

Run by bench/run.py with the python of bench/peer_env.py's venv; llamaplug is
never imported here, and llama_cpp never in llamaplug's process. Settings
match llamaplug's: same n_ctx, n_batch 2048, n_ubatch 512, threads, flash
attention on (what llama.cpp's "auto" picks on the CPU), greedy sampling.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import PP_TEXT, TG_TEXT, Timer, Workload, count_text, emit, fit, mib, status_kb, token_digest  # noqa: E402


def main() -> None:
    model_path, w = sys.argv[1], Workload.from_json(sys.argv[2])
    out: dict = {"impl": "llama-cpp-python"}
    with Timer() as t_import:
        import llama_cpp
    out["version"] = llama_cpp.__version__
    out["import_ms"] = t_import.ms
    with Timer() as t_load:
        llm = llama_cpp.Llama(model_path, n_ctx=w.n_ctx, n_batch=2048, n_ubatch=512, n_threads=w.threads,
                              n_threads_batch=w.threads, flash_attn=True, verbose=False)
    out["load_ms"] = t_load.ms
    out["rss_after_load_mib"] = mib(status_kb("VmRSS"))
    out["system_info"] = llama_cpp.llama_print_system_info().decode()

    def tokenize(text: str) -> list[int]:
        return llm.tokenize(text.encode(), add_bos=True, special=False)

    tg_tokens = tokenize(TG_TEXT)
    with Timer() as t_first:  # as in worker_llamaplug: llama.cpp's t_load ends with the first decode
        llm.create_completion(tg_tokens, max_tokens=1, temperature=0.0)
    out["first_token_ms"] = t_load.ms + t_first.ms
    out["hwm_first_token_mib"] = mib(status_kb("VmHWM"))
    out["startup_ms"] = out["import_ms"] + out["first_token_ms"]
    out["llama_t_load_ms"] = llama_cpp.llama_perf_context(llm._ctx.ctx).t_load_ms

    pp_tokens = fit(tokenize(PP_TEXT), w.pp, "prompt-processing")
    out["digests"] = {"pp": token_digest(pp_tokens), "tg": token_digest(tg_tokens)}

    def complete(tokens: list[int], n: int) -> tuple[float, dict]:
        llm.reset()  # no prefix reuse between runs: every run evaluates its whole prompt
        t0 = time.perf_counter()
        r = llm.create_completion(tokens, max_tokens=n, temperature=0.0)
        return (time.perf_counter() - t0) * 1e3, r

    if w.warmup:
        complete(pp_tokens, 1)
        complete(tg_tokens, 4)
    out["hwm_after_warmup_mib"] = mib(status_kb("VmHWM"))

    # -- prompt processing: wall time of a 1-token completion of the prompt (prompt + one sample)
    pp_runs = [complete(pp_tokens, 1) for _ in range(w.inner)]
    ms = min(r[0] for r in pp_runs)
    out["pp"] = {"tokens": pp_runs[0][1]["usage"]["prompt_tokens"], "wall_ms": ms, "tps": 1e3 * len(pp_tokens) / ms,
                 "samples_ms": [r[0] for r in pp_runs]}

    # -- generation: the peer reports no timings, so the generation part is the difference of the
    # wall times of an n-token and a 1-token completion of the same prompt: n - 1 decode+sample cycles.
    ms_1 = min(complete(tg_tokens, 1)[0] for _ in range(w.inner))
    tg_runs = [complete(tg_tokens, w.tg) for _ in range(w.inner)]
    ms_n, r = min(tg_runs, key=lambda x: x[0])
    n = r["usage"]["completion_tokens"]
    out["tg"] = {"tokens": n, "wall_ms": ms_n, "wall_1_ms": ms_1, "predicted_ms": ms_n - ms_1,
                 "tps": 1e3 * (n - 1) / (ms_n - ms_1) if n > 1 else 0.0,
                 "samples_ms": [x[0] for x in tg_runs], "text_head": r["choices"][0]["text"][:40]}

    # -- "batched": the peer has no multi-sequence API in Llama; its prompts run one after another
    if w.batch_npl:
        n_seq = max(w.batch_npl)
        prompts = [fit(tokenize(count_text(100 * s + 1)), w.batch_npp, "batched") for s in range(n_seq)]
        out["digests"]["batch"] = token_digest([t for p in prompts for t in p])
        rows = []
        for npl in w.batch_npl:
            runs = []
            for _ in range(w.inner):  # the fastest of w.inner, as for llamaplug and native
                generated = 0
                t0 = time.perf_counter()
                for j in range(npl):
                    _, r = complete(prompts[j], w.batch_ntg)
                    generated += r["usage"]["completion_tokens"]
                s = time.perf_counter() - t0
                runs.append({"npl": npl, "total_ms": s * 1e3, "generated": generated, "gen_tps": generated / s})
            rows.append(max(runs, key=lambda row: row["gen_tps"]))
        out["batched"] = rows
    out["hwm_end_mib"] = mib(status_kb("VmHWM"))
    llm.close()
    emit(out)


if __name__ == "__main__":
    main()
