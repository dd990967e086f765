#!/usr/bin/env python3
"""The chat layer's own cost: llama.cpp's chat layer (prompt, grammar, parser) per request and per streamed token.

    .tox/py/bin/python bench/chat_layer.py [--rounds 200]

Measured on SmolLM2 with its own template (no tools) and with Qwen 2.5's (tools, a lazy grammar),
in-process, no decoding: what plan_chat costs a request, and what ChatStream.feed costs a token
(the parser re-reads the reply so far each token, as llama-server's does). Medians in microseconds;
the JSON goes to bench/results/chat_layer/ when --save is given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "vendor" / "llama.cpp"))

import fetch  # noqa: E402
import llamaplug as lp  # noqa: E402
from llamaplug.catalog import default_model  # noqa: E402
from llamaplug.high.chat import ChatSpec, ChatStream, plan_chat  # noqa: E402
from llamaplug.high.completion import CompletionChunk  # noqa: E402

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "system", "content": "You are a helpful assistant."},
       {"role": "user", "content": "What is the weather in Paris?"}]
REPLY = "The weather in Paris is sunny with a light breeze, about eighteen degrees. " * 4


def _median_us(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    qwen = (fetch.materialise() / "models" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    results = {}
    with lp.Llama.load(lp.LlamaParams(model_path=default_model(), n_ctx=2048)) as llama:
        pieces = [llama.model.token_to_str(t) for t in llama.model.tokenize(REPLY, False)]
        for name, spec in {"smollm2-plain": ChatSpec(ASK), "qwen2.5-tools": ChatSpec(ASK, tools=[TOOL],
                                                                                    chat_template=qwen)}.items():
            plan_chat(llama, spec)  # the template is compiled once per model: not counted
            per_request = _median_us(lambda s=spec: plan_chat(llama, s), args.rounds)
            plan = plan_chat(llama, spec)

            def stream(plan=plan) -> None:
                s = ChatStream("m", plan)
                for piece in pieces:
                    s.feed(CompletionChunk(piece, [0], None))

            per_reply = _median_us(stream, max(10, args.rounds // 10))
            results[name] = {"plan_chat_us": round(per_request, 1),
                             "stream_us_per_token": round(per_reply / len(pieces), 2),
                             "reply_tokens": len(pieces)}
            print(f"{name}: plan_chat {per_request:.0f} us a request, ChatStream.feed "
                  f"{per_reply / len(pieces):.1f} us a token over a {len(pieces)}-token reply")
    if args.save:
        out = HERE / "results" / "chat_layer" / f"vm-{time.strftime('%Y-%m-%dT%H%M')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")
        print(out)


if __name__ == "__main__":
    main()
