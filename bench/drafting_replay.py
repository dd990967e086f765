#!/usr/bin/env python3
"""Drafting settings tried offline: the n-gram drafter replayed over recorded greedy chats, priced by this machine's
llama_decode cost per batch size (issue 45).

    /tmp/lp/hv/bin/python bench/drafting_replay.py --model smollm2 [--max-tokens 256] [--threads 2]

1. Records `bench/serving.py drafting`'s copy and free chats once, greedy and without drafting (one Llama): each
   chat's prompt (the chat layer's rendering, tokenized) and reply (its text tokenized again: a few tokens may split
   differently from the generated ones).
2. Measures llama_decode of 1, 2, 4, ... 64 tokens after a 400-token history (the median of 5), with logits on every
   row as a verify batch has them.
3. Replays NgramModDrafter ("auto" and "ngram-mod") with each setting over the chats in the bench's order (one table
   for all, as one server): a step decodes the slot's next token and its draft, keeps the guesses the recorded
   reply continues with, and costs decode(1 + draft) / decode(1). Prints, per setting and chat set, the modelled
   generation speed-up over no drafting (prefill excluded, so the bench's ratios are lower), steps, tokens drafted
   and accepted. "auto chosen" is what `serve` runs: no n-gram setting given, the drafter picks one from the
   cost of a drafted row that it measures from the step timings the replay hands it (the priced decodes), as the
   engine's runner does with its real ones (high/row_cost.py, high/ngram_mod.py's REGIMES).
   `--linear 0.05,0.25` replays again on made-up curves, decode(n) = decode(1) * (1 + r (n - 1)), one per r.

A drafter setting only moves what this prints; where a verify row costs about half a single decode (SmolLM2's Q4_1
on x86 has no GEMM kernel), even every token accepted in 64-token drafts gives under 2x.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("serving", HERE / "serving.py")
serving = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serving)  # type: ignore[union-attr]

SIZES = (1, 2, 4, 8, 16, 32, 64)
# (kind, n_match, n_min, n_max); None: "auto"'s choice (n_max None: --n-max, the most any setting drafts)
SETTINGS = [("auto", None, None, None), ("auto", 24, 48, None), ("ngram-mod", 24, 48, None), ("auto", 16, 32, None),
            ("ngram-mod", 16, 32, None), ("auto", 12, 24, None), ("auto", 8, 16, None), ("auto", 12, 24, 32),
            ("auto", 8, 16, 32)]


def record(model: Path, max_tokens: int, threads: int) -> dict:
    import llamaplug as lp
    from llamaplug.blocks.batch import LlamaBatch
    from llamaplug.high.chat_plan import render_prompt

    chats = []
    with lp.Llama.load(lp.LlamaParams(model, n_ctx=4096, n_threads=threads, cache_ram_mib=0)) as llama:
        for name, prompts in (("copy", serving._copy_prompts()), ("free", serving.FREE_PROMPTS)):
            for text in prompts:
                messages = [{"role": "user", "content": text}]
                prompt, _ = render_prompt(llama, messages, None, None)
                got = llama.create_chat_completion(messages, max_tokens=max_tokens, temperature=0)
                reply = got.choices[0].message.content or ""
                chats.append({"set": name, "prompt": llama.tokenize(prompt, False, True),
                              "reply": llama.tokenize(reply, False, False)})
                print(f"recorded {name}: {len(chats[-1]['prompt'])} + {len(chats[-1]['reply'])} tokens", flush=True)
    # A fresh context: its sequence 0 holds no chat, and the engine owns the first one's.
    with lp.Llama.load(lp.LlamaParams(model, n_ctx=4096, n_threads=threads, cache_ram_mib=0)) as llama:
        ctx = llama.context
        words = llama.tokenize((HERE.parent / "README.md").read_text(encoding="utf-8"), False)[:600]
        batch = LlamaBatch(1024, 1)
        batch.add_sequence(words[:400], 0, False, 0)
        ctx.decode(batch)
        curve = {}
        for n in SIZES:
            times = []
            for _ in range(5):
                batch.clear()
                for i in range(n):
                    batch.add(words[400 + i], 400 + i, 0, True)
                t0 = time.perf_counter()
                ctx.decode(batch)
                times.append(time.perf_counter() - t0)
                ctx.kv_cache_seq_rm(0, 400, -1)
            curve[n] = statistics.median(times)
            print(f"decode of {n:2} tokens: {curve[n] * 1e3:.2f} ms ({curve[n] / curve[1]:.2f}x one)", flush=True)
    return {"model": model.name, "threads": threads, "chats": chats, "curve": curve}


def price(curve: dict[int, float], n: int) -> float:
    """decode(n) / decode(1), linear between the measured sizes."""
    sizes = sorted(curve)
    for a, b in zip(sizes, sizes[1:]):
        if a <= n <= b:
            return (curve[a] + (curve[b] - curve[a]) * (n - a) / (b - a)) / curve[sizes[0]]
    return curve[sizes[-1]] * n / sizes[-1] / curve[sizes[0]]


def replay(chats: list[dict], curve: dict[int, float], kind: str, n_match: int | None, n_min: int | None,
           n_max: int | None, max_tokens: int) -> dict[str, list[float]]:
    from llamaplug.high.ngram_mod import NgramModDrafter
    from llamaplug.high.speculative import DraftRequest

    drafter = NgramModDrafter(n_match, n_min, n_max, adaptive=kind == "auto")
    n_max = drafter.draft_max
    out: dict[str, list[float]] = {}
    for chat in chats:
        job, prompt, reply = object(), chat["prompt"], chat["reply"]
        tally = out.setdefault(chat["set"], [0, 0.0, 0, 0, 0])  # tokens, cost, steps, drafted, accepted
        i = 0
        while i < len(reply):
            room = min(n_max, max_tokens - i - 2)  # the scheduler's: room for one sampled after the last guess
            draft = drafter.draft([DraftRequest(0, prompt + reply[:i], reply[i], room, job)])[0] if room > 0 else []
            kept = 0
            for guess, truth in zip(draft, reply[i + 1:]):
                if guess != truth:
                    break
                kept += 1
            cost = price(curve, 1 + len(draft))
            drafter.decoded(1, len(draft), cost * curve[min(curve)])  # the runner's timing of this step
            tally[0] += 1 + kept
            tally[1] += cost
            tally[2] += 1
            tally[3] += len(draft)
            tally[4] += kept
            i += 1 + kept
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=serving.THREADS)
    ap.add_argument("--n-max", type=int, default=64)
    ap.add_argument("--recorded", metavar="FILE", help="replay this earlier record (this script's JSON) instead")
    ap.add_argument("--linear", metavar="R,...", help="also replay on made-up curves: a row costs R of a decode")
    args = ap.parse_args()
    if args.recorded:
        data = json.loads(Path(args.recorded).read_text(encoding="utf-8"))
        data["curve"] = {int(k): v for k, v in data["curve"].items()}
    else:
        data = record(serving.model_path(args.model), args.max_tokens, args.threads)
    curves = {"measured": data["curve"]}
    for r in (float(x) for x in args.linear.split(",")) if args.linear else ():
        curves[f"linear {r}"] = {n: 1 + r * (n - 1) for n in SIZES}
    results: dict[str, dict] = {}
    for name, curve in curves.items():
        print(f"-- {name} curve: a row costs {(price(curve, 33) - 1) / 32:.2f} of a decode at 33 rows, "
              f"{(price(curve, 65) - 1) / 64:.2f} at 65", flush=True)
        for kind, n_match, n_min, n_max in SETTINGS:
            limit = None if n_match is None else n_max or args.n_max
            got = replay(data["chats"], curve, kind, n_match, n_min, limit, args.max_tokens)
            key = f"{kind} chosen" if n_match is None else f"{kind} {n_match}/{n_min}/{limit}"
            mine = results.setdefault(name, {})[key] = {
                s: {"speedup": t[0] / t[1], "steps": t[2], "drafted": t[3], "accepted": t[4], "tokens": t[0]}
                for s, t in got.items()}
            print(f"{key:22} " + "  ".join(f"{s}: {v['speedup']:.2f}x ({v['steps']} steps, {v['accepted']}/"
                                           f"{v['drafted']} accepted)" for s, v in mine.items()), flush=True)
    serving.OUT.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H%M")
    path = serving.OUT / f"replay-{stamp}-{Path(data.get('model', args.model)).stem}.json"
    path.write_text(json.dumps({**data, "argv": sys.argv[1:], "results": results}), encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
