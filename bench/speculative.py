#!/usr/bin/env python3
"""Speculative decoding, llamaplug against the pin's llama-speculative-simple, on the same pairs and prompts.

    .venv/bin/python bench/speculative.py --rounds 5 --out bench/results/spec/NAME.json

Cases (target, drafter, prompt):

- smollm2-draft: SmolLM2-135M Q8_0 drafted by its Q4_1 (the catalog file);
- gemma-draft: Gemma-3-270M Q8_0 drafted by its Q4_K_M;
- smollm2-ngram: SmolLM2-135M Q8_0 with n-gram lookup, on a prompt whose answer quotes it.

The Q8_0 targets are made from the Q4 files with our own `llamaplug.quantize(..., allow_requantize=True)`
into ~/.cache/llamaplug/bench-spec (byte-identical to the pin's `llama-quantize --allow-requantize` for Q8_0:
tests/test_quantize.py).

Each round runs, in alternating order, four generations of `--tokens` greedy tokens: ours without
and with drafting (one loaded Llama each), llama-completion (native, no draft) and
llama-speculative-simple (native, drafting with --spec-draft-n-max = ours' draft_max). Speed is
the generation phase's tokens/s (after the prompt); a round's speedup is drafting / no draft on
the same side. Reported per case: the median of the rounds' speedups, ours / native's speedup
(the goal: >= 0.95), and both acceptance rates (accepted / drafted; the goal: within 2 points).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

CACHE = Path.home() / ".cache" / "llamaplug" / "bench-spec"
# Asked through the target's chat template. llama-speculative-simple does not stop at -n exactly (with no
# room left it drafts a whole draft anyway and accepts past -n: 401 tokens for 384), so its acceptance
# covers a few more tokens than ours.
STORY = [{"role": "user", "content": "Tell me a short story about a brave little cat."}]
# Its answer quotes the code (n-gram lookup's case); greedy, both sides give the same text (checked: with the
# earlier "repeat this code with a comment above each function" llama-speculative-simple's own text parted
# from llama-completion's at a near-tie, and the two sides drafted different texts).
CODE = ("Add a comment to each line of this code, keeping the code as it is.\n\nfor i in range(10):\n"
        "    x = i * i\n    y = x + 1\n    print(i, x, y)\n\nThe same code with comments:\n\nfor i in range(10):")


def native_bin() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run import native_tools

    return native_tools("cpu")


def q8_copy(bin_dir: Path, source: Path, name: str) -> Path:
    """A Q8_0 copy of `source`, made by llamaplug.quantize (it writes beside the target and renames)."""
    import llamaplug as lp

    CACHE.mkdir(parents=True, exist_ok=True)
    target = CACHE / name
    if not target.exists():
        lp.quantize(source, target, "Q8_0", allow_requantize=True, quiet=True)
    return target


def _env(bin_dir: Path) -> dict[str, str]:
    return {**os.environ, "LD_LIBRARY_PATH": str(bin_dir)}


def native_plain(bin_dir: Path, target: Path, prompt: str, n: int, threads: int) -> dict[str, float]:
    out = subprocess.run([str(bin_dir / "llama-completion"), "-m", str(target), "-p", prompt, "-n", str(n),
                          "--temp", "0", "-t", str(threads), "-c", "2048", "-no-cnv", "-ngl", "0"],
                         capture_output=True, text=True, env=_env(bin_dir), stdin=subprocess.DEVNULL, check=True)
    m = re.search(r"\s eval time =\s*([\d.]+) ms /\s*(\d+) runs", out.stdout + out.stderr)
    if not m:
        raise RuntimeError(f"llama-completion printed no eval time: {out.stderr[-500:]}")
    ms, runs = float(m.group(1)), int(m.group(2))
    return {"tps": 1e3 * runs / ms, "tokens": runs}


def native_spec(bin_dir: Path, target: Path, draft: Path | None, prompt: str, n: int, threads: int,
                draft_max: int, ngram_size: int) -> dict[str, float]:
    spec = (["-md", str(draft), "--spec-type", "draft-simple"] if draft is not None else
            ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(ngram_size),
             "--spec-ngram-simple-size-m", str(draft_max)])
    out = subprocess.run([str(bin_dir / "llama-speculative-simple"), "-m", str(target), *spec,
                          "--spec-draft-n-max", str(draft_max), "-p", prompt, "-n", str(n), "--temp", "0",
                          "-t", str(threads), "-c", "2048", "-ngl", "0", "-ngld", "0"],
                         capture_output=True, text=True, env=_env(bin_dir), stdin=subprocess.DEVNULL, check=True)
    text = out.stdout + out.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", text)
    drafted = re.search(r"n_drafted = (\d+)", text)
    accepted = re.search(r"n_accept\s+= (\d+)", text)
    if not (m and drafted and accepted):
        raise RuntimeError(f"llama-speculative-simple printed no summary: {text[-800:]}")
    return {"tps": int(m.group(1)) / float(m.group(2)), "tokens": int(m.group(1)),
            "drafted": int(drafted.group(1)), "accepted": int(accepted.group(1))}


def ours(llama, prompt: str, n: int) -> dict[str, float]:
    # A fresh cache each run, as each native run's: a reused prefix re-decodes the prompt's last token alone,
    # whose logits may round apart from the whole prompt's and tip a near-tie into another text.
    llama.context.clear_cache()
    done = llama.create_completion(prompt, max_tokens=n, special=True)
    t = done.timings
    # predicted_ms runs from the first token to the last: the generation phase, as native's figures.
    return {"tps": 1e3 * (t.predicted_tokens - 1) / t.predicted_ms if t.predicted_tokens > 1 else 0.0,
            "tokens": t.predicted_tokens, "drafted": t.drafted_tokens, "accepted": t.accepted_tokens}


def the_four(a: argparse.Namespace, bin_dir: Path, target: Path, draft: Path | None, prompt: str, plain_llama,
             spec_llama) -> dict[str, Callable[[], dict[str, float]]]:
    return {
        "ours_plain": lambda: ours(plain_llama, prompt, a.tokens),
        "ours_spec": lambda: ours(spec_llama, prompt, a.tokens),
        "native_plain": lambda: native_plain(bin_dir, target, prompt, a.tokens, a.threads),
        "native_spec": lambda: native_spec(bin_dir, target, draft, prompt, a.tokens, a.threads, a.draft_max,
                                           a.ngram_size),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=384)
    ap.add_argument("--threads", type=int, default=1,
                    help="1 by default: drafting makes many one-token decodes, each a thread barrier that a "
                         "shared machine stretches")
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--ngram-size", type=int, default=12)
    ap.add_argument("--cases", default="smollm2-draft,gemma-draft,smollm2-ngram")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    import llamaplug as lp
    from llamaplug.catalog import default_model, entries

    bin_dir = native_bin()
    smollm2 = Path(default_model("smollm2-135m-instruct"))
    gemma_path = next(e for e in entries() if e.name == "gemma-3-270m").locate()
    cases = {
        "smollm2-draft": (smollm2, "smollm2-q8_0.gguf", {"draft_model_path": smollm2}, STORY),
        "gemma-draft": (gemma_path, "gemma3-270m-q8_0.gguf", {"draft_model_path": gemma_path}, STORY),
        "smollm2-ngram": (smollm2, "smollm2-q8_0.gguf", {"speculative": "ngram", "ngram_size": a.ngram_size}, CODE),
    }
    report: dict[str, object] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.node(),
        "cpus": os.cpu_count(), "load_before": os.getloadavg(), "rounds": a.rounds, "tokens": a.tokens,
        "threads": a.threads, "draft_max": a.draft_max, "ngram_size": a.ngram_size, "cases": {},
    }
    for name in a.cases.split(","):
        source, q8_name, spec, prompt = cases[name]
        if source is None:
            print(f"{name}: model not installed, skipped", file=sys.stderr)
            continue
        target = q8_copy(bin_dir, Path(source), q8_name)
        draft = spec.get("draft_model_path")
        common = {"n_ctx": 2048, "n_threads": a.threads, "n_gpu_layers": 0, "draft_max": a.draft_max}
        plain_llama = lp.Llama.load(lp.LlamaParams(target, **{**common, "draft_max": 16}))
        spec_llama = lp.Llama.load(lp.LlamaParams(target, **common, **spec))
        if not isinstance(prompt, str):  # chat messages: the template's text, special tokens spelled out
            run = lp.start_chat(plain_llama, lp.ChatCall(lp.ChatSpec(prompt)))
            prompt = plain_llama.detokenize(run.jobs[0].prompt, special=True)
            run.close()
        runs = the_four(a, bin_dir, target, draft, prompt, plain_llama, spec_llama)
        for run in runs.values():  # warm-up: page cache, the Q8_0 file, our first-call costs
            run()
        rounds = []
        order = list(runs)
        for r in range(a.rounds):
            keys = order if r % 2 == 0 else order[::-1]
            rounds.append({k: runs[k]() for k in keys})
            row = rounds[-1]
            print(f"{name} round {r}: " + ", ".join(f"{k} {v['tps']:.1f} t/s" for k, v in row.items()),
                  file=sys.stderr, flush=True)
        plain_llama.close()
        spec_llama.close()
        ours_speedup = [x["ours_spec"]["tps"] / x["ours_plain"]["tps"] for x in rounds]
        native_speedup = [x["native_spec"]["tps"] / x["native_plain"]["tps"] for x in rounds]
        relative = [o / n for o, n in zip(ours_speedup, native_speedup)]
        last = rounds[-1]
        ours_rate = last["ours_spec"]["accepted"] / max(1, last["ours_spec"]["drafted"])
        native_rate = last["native_spec"]["accepted"] / max(1, last["native_spec"]["drafted"])
        summary = {
            "target": str(target), "draft": str(draft) if draft else "ngram", "prompt": prompt,
            "ours_speedup": statistics.median(ours_speedup), "native_speedup": statistics.median(native_speedup),
            "ours_over_native_speedup": statistics.median(relative),
            "relative_quartiles": statistics.quantiles(relative, n=4) if len(relative) > 1 else relative,
            "ours_acceptance": ours_rate, "native_acceptance": native_rate,
            "acceptance_gap_points": 100 * abs(ours_rate - native_rate),
            "ours_drafted_accepted": [last["ours_spec"]["drafted"], last["ours_spec"]["accepted"]],
            "native_drafted_accepted": [last["native_spec"]["drafted"], last["native_spec"]["accepted"]],
            "tokens": {k: v["tokens"] for k, v in last.items()},
            "rounds": rounds,
        }
        report["cases"][name] = summary  # type: ignore[index]
        print(f"{name}: speedup ours {summary['ours_speedup']:.2f}x, native {summary['native_speedup']:.2f}x, "
              f"ours/native {summary['ours_over_native_speedup']:.3f}; acceptance ours {100 * ours_rate:.1f}%, "
              f"native {100 * native_rate:.1f}%", flush=True)
    report["load_after"] = os.getloadavg()
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
