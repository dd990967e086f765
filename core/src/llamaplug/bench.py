"""`llamaplug bench`: llamaplug's own speed on a model, for users.

    llamaplug bench [-m model.gguf] [-t 4] [--pp 512] [--tg 128] [--batched 1,4,16]

Prompt processing and generation through `Llama.create_completion` (greedy), and
batched generation: n sequences in one context, one decode per step for all of them.
Each measurement runs `--inner` times and the fastest counts (other load only ever
slows a run). The repository's bench/run.py compares the same measurements, in one
run, with native llama.cpp and llama-cpp-python.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: the CLI builds this command's parser for every command (serve too)
    from .blocks.model import LlamaModel
    from .high.completion import Completion
    from .high.llama import Llama


def filler_text(n_words: int) -> str:
    """Plain prose, long enough to cut any prompt length from."""
    return " ".join(f"Section {i}: the river crossed the valley and the town grew along its banks."
                    for i in range(n_words // 12 + 1))


def complete_greedy(llama: Llama, tokens: list[int], n: int) -> Completion:
    from .blocks.sampling import SamplerChain

    with SamplerChain().greedy() as sampler:
        return llama.create_completion(tokens, max_tokens=n, sampler=sampler)


def prompt_rate(llama: Llama, tokens: list[int], inner: int) -> dict[str, Any]:
    """Prompt processing: the prompt part of Completion.timings, fastest of `inner` runs."""
    runs = []
    for _ in range(inner):
        # A slot keeps its tokens for the next request that shares them: without forgetting them the
        # second run would read one token and report the whole prompt's rate.
        llama.context.kv_cache_clear()
        t0 = time.perf_counter()
        c = complete_greedy(llama, tokens, 1)
        if c.timings.cached_tokens:
            raise RuntimeError(f"prompt processing reused {c.timings.cached_tokens} cached tokens")
        runs.append((c.timings.prompt_ms, (time.perf_counter() - t0) * 1e3))
    prompt_ms, wall_ms = min(runs)
    return {"tokens": len(tokens), "prompt_ms": prompt_ms, "wall_ms": wall_ms, "tps": 1e3 * len(tokens) / prompt_ms,
            "samples_ms": [r[0] for r in runs]}


def generation_rate(llama: Llama, tokens: list[int], n: int, inner: int) -> dict[str, Any]:
    """Generation: the generation part of Completion.timings, fastest of `inner` runs.

    n tokens are n samples but n - 1 decodes (the last token is not fed back), while
    llama-bench's tg times n decodes: "tps" counts the n - 1 full decode + sample cycles.
    """
    runs = []
    for _ in range(inner):
        t0 = time.perf_counter()
        c = complete_greedy(llama, tokens, n)
        runs.append((c.timings.predicted_ms, (time.perf_counter() - t0) * 1e3, c))
    predicted_ms, wall_ms, c = min(runs, key=lambda r: r[0])
    k = c.timings.predicted_tokens
    return {"tokens": k, "predicted_ms": predicted_ms, "wall_ms": wall_ms,
            "tps_reported": c.timings.predicted_per_second, "tps": 1e3 * (k - 1) / predicted_ms if k > 1 else 0.0,
            "samples_ms": [r[0] for r in runs], "text_head": c.text[:40]}


def batched_rates(model: LlamaModel, prompts: list[list[int]], npl_list: list[int], n_gen: int, n_ctx: int,
                  n_threads: int, inner: int = 1) -> list[dict[str, Any]]:
    """For each npl: prefill npl prompts in one batch, then n_gen steps of one batch of npl tokens.

    Each npl runs `inner` times; the fastest generation counts.
    """
    from .blocks.batch import LlamaBatch
    from .blocks.context import LlamaContext
    from .blocks.sampling import SamplerChain
    from .params import ContextParams

    n_seq = max(npl_list)
    with LlamaContext(model, ContextParams(n_ctx=n_ctx, n_seq_max=n_seq, n_threads=n_threads,
                                           n_threads_batch=n_threads)) as ctx:
        warm = LlamaBatch(16, 1)  # llama-batched-bench's warm-up: 16 tokens of sequence 0
        warm.add_sequence((prompts[0] * 16)[:16], 0)
        ctx.decode(warm)
        rows = []
        for npl in [n for n in npl_list for _ in range(inner)]:
            ctx.clear_cache()
            samplers = [SamplerChain().greedy() for _ in range(npl)]
            n_prompt = len(prompts[0])
            prefill = LlamaBatch(npl * n_prompt, 1)
            step = LlamaBatch(npl, 1)
            t0 = time.perf_counter()
            for j in range(npl):
                prefill.add_sequence(prompts[j], j, False, 0)
            ctx.decode(prefill)
            t1 = time.perf_counter()
            idx = [(j + 1) * n_prompt - 1 for j in range(npl)]
            pos = n_prompt
            for _ in range(n_gen):
                step.clear()
                for j in range(npl):
                    step.add(samplers[j].sample(ctx, idx[j]), pos, j, True)
                ctx.decode(step)
                idx = list(range(npl))
                pos += 1
            t2 = time.perf_counter()
            for s in samplers:
                s.close()
            gen = npl * n_gen
            row = {"npl": npl, "pp_ms": (t1 - t0) * 1e3, "tg_ms": (t2 - t1) * 1e3,
                   "tg_tps": gen / (t2 - t1), "gen_tps": gen / (t2 - t0)}
            if rows and rows[-1]["npl"] == npl:
                if row["tg_tps"] > rows[-1]["tg_tps"]:
                    rows[-1] = row
            else:
                rows.append(row)
        return rows


def main(args: argparse.Namespace) -> int:
    from .catalog import default_model
    from .high.llama import Llama
    from .params import LlamaParams

    path = args.model or default_model(None)
    extra: dict[str, Any] = {"n_threads": args.threads, "n_threads_batch": args.threads} if args.threads else {}
    if args.backend:
        extra["backends"] = [args.backend]
    say = (lambda text: None) if args.quiet else (lambda text: print(f"bench: {text}", file=sys.stderr, flush=True))
    say(f"loading {path}")
    t0 = time.perf_counter()
    llama = Llama.load(LlamaParams(model_path=path, n_ctx=max(2048, args.pp + args.tg + 8), **extra))
    load_ms = (time.perf_counter() - t0) * 1e3
    threads = llama.context.params.n_threads
    with llama:
        text = llama.tokenize(filler_text(args.pp))
        if len(text) < args.pp:
            raise SystemExit(f"bench: the filler text has only {len(text)} tokens, --pp {args.pp} asks more")
        pp_tokens, tg_tokens = text[: args.pp], llama.tokenize("1, 2, 3, 4, 5, 6, 7, 8,")
        complete_greedy(llama, pp_tokens, 1)  # warm-up, as llama-bench
        result: dict[str, Any] = {"model": str(path), "threads": threads, "load_ms": load_ms,
                                  "backends": [b.name for b in llama.backend.backends() if b.loaded]}
        say(f"pp{args.pp}: reading the prompt {args.inner} times ({threads} threads)")
        result["pp"] = prompt_rate(llama, pp_tokens, args.inner)
        say(f"pp{args.pp}: {result['pp']['tps']:.1f} tokens/s; tg{args.tg}: generating {args.inner} times")
        result["tg"] = generation_rate(llama, tg_tokens, args.tg, args.inner)
        say(f"tg{args.tg}: {result['tg']['tps']:.1f} tokens/s")
        if args.batched:
            say(f"batched: {args.batched} sequences x 64 tokens, {args.inner} times each")
            npl = [int(x) for x in args.batched.split(",")]
            prompts = [llama.tokenize(", ".join(str(k) for k in range(100 * s + 1, 100 * s + 400)))[:16]
                       for s in range(max(npl))]
            # on the engine's thread: a second thread computing would slow both (engine.py, one thread computes)
            result["batched"] = llama.engine.call(
                lambda: batched_rates(llama.model, prompts, npl, 64, 2048, threads, args.inner))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"model {path}\nbackends {', '.join(result['backends'])}, {threads} threads, load {load_ms:.0f} ms")
    print(f"pp{args.pp}  {result['pp']['tps']:8.1f} tokens/s   (create_completion, fastest of {args.inner})")
    print(f"tg{args.tg}  {result['tg']['tps']:8.1f} tokens/s   (create_completion, greedy)")
    for row in result.get("batched", []):
        print(f"batched {row['npl']:>2} x 64  {row['tg_tps']:8.1f} tokens/s aggregate")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="measure prompt processing, generation and batched speed on a model")
    p.add_argument("-m", "--model", help="GGUF file (default: the catalog's default model)")
    p.add_argument("-t", "--threads", type=int)
    p.add_argument("--backend", help="use only this backend plugin (e.g. cuda, vulkan, cpu)")
    p.add_argument("--pp", type=int, default=512, metavar="N",
                   help="prompt processing: tokens of the prompt read in one go (default 512)")
    p.add_argument("--tg", type=int, default=128, metavar="N",
                   help="text generation: tokens generated one by one, greedy (default 128)")
    p.add_argument("--batched", default="1,4,16", help="parallel sequences, comma-separated ('' = skip)")
    p.add_argument("--inner", type=int, default=3, metavar="N",
                   help="runs of each measurement; the fastest counts (default 3)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout instead of the table")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=main)
