#!/usr/bin/env python3
"""Tokenizing 1 MB of text: llamaplug-tokenizer-hf's exported tokenizer against llama.cpp's own llama_tokenize.

    .tox/py/bin/python bench/tokenizer_hf.py [--rounds 5] [--mib 1] [--model smollm2-135m-instruct gemma-3-270m ...]

The text is tests/fixtures/tokenizer_corpus.py's multilingual corpus (prose, licences, ~200
languages of translations, code, emoji, rare scripts) repeated to the size asked for, as one
string. llama.cpp: LlamaModel.tokenize on a vocab_only load (one llama_tokenize call; the cffi
call and the list of ids are all that is Python). HF: HFTokenizer.tokenize of the tokenizer
exported from the same GGUF (one `tokenizers` encode_batch_fast call, no special-token parsing), after
checking that both give the same ids. Both single-threaded; the best of `rounds` counts.
The ratio is HF time / llama.cpp time: the target is at most 2. `hf_without_normalizer_s` is the
same tokenizer with its normalizer taken out, on the text already normalized: what the
pre-tokenizer and the model cost alone, i.e. the least any normalizer could reach.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "fixtures"))


def text_of(size: int) -> str:
    import tokenizer_corpus

    base = "\n".join(tokenizer_corpus.lines()) + "\n"
    out = base * (size // len(base.encode()) + 1)
    return out.encode()[:size].decode("utf-8", "ignore")


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    import os

    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers' own thread pool (batch encode only)
    from llamaplug_tokenizer_hf import HFTokenizer
    from llamaplug_tokenizer_hf.export import export
    from tokenizers import Tokenizer

    import llamaplug as lp
    from llamaplug.catalog import entries

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mib", type=float, default=1.0)
    p.add_argument("--model", nargs="*", default=["smollm2-135m-instruct", "gemma-3-270m"])
    p.add_argument("--gguf", nargs="*", default=[], help="further GGUF files (vocab-only ones will do)")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)

    text = text_of(int(args.mib * 2**20))
    lp.LlamaBackend.init()
    paths = [(name, next(e for e in entries() if e.name == name).locate()) for name in args.model]
    paths += [(Path(g).name, Path(g)) for g in args.gguf]
    results = []
    for name, path in paths:
        if path is None:
            print(f"{name}: not installed, skipped", file=sys.stderr)
            continue
        hf = HFTokenizer(export(path), name)
        with lp.LlamaModel(path, lp.ModelParams(vocab_only=True)) as model:
            ids = model.tokenize(text, add_bos=False)
            assert hf.tokenize(text, add_bos=False) == ids, f"{name}: the exported tokenizer differs on the bench text"
            native = best(lambda: model.tokenize(text, add_bos=False), args.rounds)  # noqa: B023
            ours = best(lambda: hf.tokenize(text, add_bos=False), args.rounds)  # noqa: B023
        bare = Tokenizer.from_str(hf.tokenizer.to_str())
        normalized = bare.normalizer.normalize_str(text) if bare.normalizer else text
        bare.normalizer = None
        floor = best(lambda: bare.encode_batch_fast([normalized], add_special_tokens=False), args.rounds)  # noqa: B023
        row = {"model": name, "bytes": len(text.encode()), "tokens": len(ids), "llama_cpp_s": round(native, 4),
               "hf_s": round(ours, 4), "ratio_hf_over_llama_cpp": round(ours / native, 3),
               "hf_without_normalizer_s": round(floor, 4), "ratio_without_normalizer": round(floor / native, 3)}
        results.append(row)
        print(f"{name:28} {row['bytes'] / 2**20:.2f} MiB {row['tokens']:8} tokens  llama.cpp {native * 1e3:8.1f} ms  "
              f"tokenizers {ours * 1e3:8.1f} ms  ratio {row['ratio_hf_over_llama_cpp']:.2f}  "
              f"(without normalizer {row['ratio_without_normalizer']:.2f})")
    if args.json:
        args.json.write_text(json.dumps({"machine": platform.machine(), "python": platform.python_version(),
                                         "rounds": args.rounds, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
