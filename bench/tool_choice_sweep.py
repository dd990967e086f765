#!/usr/bin/env python3
"""tool_choice "required" and a named function on every template of the pin's models/templates (issue 42 part 2).

    .tox/py/bin/python bench/tool_choice_sweep.py [--max-tokens 128] [--templates Qwen GLM ...]

SmolLM2 with no few-shot turns, the template given per request, greedy: for each template, `tool_choice="required"`
whole and a named function streamed, both with `parallel_tool_calls=False`. Each outcome is one of: "call" (one
call of an offered tool whose arguments validate against its schema; for the named one, that function), "call,
length" (the call whole, the reply cut after it by max_tokens: Mistral's unbounded id), "call after thinking (budget
16)" (a reply that thought until max_tokens, asked again with reasoning_budget_tokens: the call came after the
thinking), "refused" (a template with no place for tools: generation refuses them with an InvalidParameterError
naming tools, as the library promises), or what else came (text, no call, a bad call, with or without the budget,
llama.cpp's parser refusing what its own grammar let through, an error): those are the failures.
tests/test_tool_choice.py checks the main families in the suite; this sweep is the whole list, too slow for CI
(about 30 s a template on 2 cores: ~35 min). Results go to bench/results/tool_choice/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "vendor" / "llama.cpp"))
sys.path.insert(0, str(HERE.parent / "tests"))

# the suite's cases (tests/test_tool_choice.py): the same tools, question and reading of a stream
from test_tool_choice import ASK, NAMED, SCHEMAS, TOOLS  # noqa: E402
from test_tool_choice import _streamed as streamed  # noqa: E402


def judge(calls: list[tuple[str, str]], finish: str | None, names: set[str]) -> str:
    import jsonschema

    if len(calls) != 1:
        return f"{len(calls)} calls, finish {finish}"
    name, arguments = calls[0]
    if name not in names:
        return f"called {name!r}"
    try:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    except (ValueError, jsonschema.ValidationError) as exc:
        return f"bad arguments {arguments!r}: {str(exc)[:80]}"
    if any("<" in v for v in json.loads(arguments).values() if isinstance(v, str)):
        # valid by the schema, but a city or a zone: the template's markup (or the schema's) written into the value.
        # A newline is not markup: a value with one ("ZonE:\n" on Gemma 4, "]\n" on MiniMax-M3, "UTC\n" on
        # Qwen3-Coder, "\n" on Seed-OSS) is what llama.cpp's parser reads back from the template's own rendering of
        # the call, unchanged, and valid by the schema; the forced grammar takes it as the schema does (earlier sweeps
        # counted it as markup)
        return f"markup in arguments {arguments!r}"
    return "call" if finish == "tool_calls" else f"call, {finish}"


BUDGET = 16  # reasoning_budget_tokens for the retry of a reply that thought until max_tokens


def whole(llama: Any, given: dict[str, Any]) -> tuple[str, str]:
    """(outcome, its thinking) of tool_choice "required", whole."""
    choice = llama.create_chat_completion(ASK, tool_choice="required", **given).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    out = judge(calls, choice.finish_reason, set(SCHEMAS))
    if choice.message.content:
        out += f" (content {choice.message.content[:40]!r})"
    return out, choice.message.reasoning_content or ""


def named(llama: Any, given: dict[str, Any]) -> tuple[str, str]:
    """(outcome, its thinking) of a named function, streamed."""
    chunks = list(llama.create_chat_completion(ASK, tool_choice=NAMED, stream=True, **given))
    calls, finish = streamed(chunks)
    thinking = "".join(c.choices[0].delta.reasoning_content or "" for c in chunks if c.choices)
    return judge(calls, finish, {"get_time"}), thinking


def outcome(llama: Any, ask: Any, given: dict[str, Any]) -> str:
    """What `ask` gave; a reply that thought until max_tokens with no call is asked again with a reasoning budget:
    the call must come after the thinking (llama-server's reasoning_budget_tokens ends it with the end tag)."""
    import llamaplug as lp

    try:
        out, thinking = ask(llama, given)
        if out.startswith("0 calls, finish length") and thinking:
            out, _ = ask(llama, {**given, "reasoning_budget_tokens": BUDGET})
            out = (f"{out} after thinking (budget {BUDGET})" if out.startswith("call") else
                   f"thought until max_tokens; with budget {BUDGET}: {out}")
        return out
    except lp.InvalidParameterError as exc:
        return "refused" if "tools" in str(exc) else f"{type(exc).__name__}: {exc}"[:160]
    except lp.ChatTemplateError as exc:
        if "does not match the expected" in str(exc):
            return "llama.cpp's parser refuses what its own grammar let through"
        return f"{type(exc).__name__}: {exc}"[:160]
    except lp.LlamaError as exc:
        return f"{type(exc).__name__}: {exc}"[:160]


def one(llama: Any, text: str, max_tokens: int) -> dict[str, str]:
    given = dict(tools=TOOLS, chat_template=text, max_tokens=max_tokens, parallel_tool_calls=False, temperature=0)
    return {"required": outcome(llama, whole, given), "named, streamed": outcome(llama, named, given)}


def theirs(bin_dir: Path, model: Path, template: Path, max_tokens: int) -> dict[str, str]:
    """The pin's llama-server on `template`, asked the same two requests (its outcome judged the same way)."""
    import openai
    from llamaplug_testing.servers import llama_server

    body: dict[str, Any] = dict(model="m", messages=ASK, tools=TOOLS, max_tokens=max_tokens, temperature=0,
                                parallel_tool_calls=False)
    out: dict[str, str] = {}
    with llama_server(bin_dir, model, "-c", "8192", "--jinja", "--chat-template-file", str(template)) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=1800)
        try:
            choice = client.chat.completions.create(tool_choice="required", **body).choices[0]
            calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
            out["required"] = judge(calls, choice.finish_reason, set(SCHEMAS)) + (
                f" (content {choice.message.content[:40]!r})" if choice.message.content else "")
        except openai.APIError as exc:
            out["required"] = f"error {str(exc)[:120]}"
        try:
            chunks = list(client.chat.completions.create(tool_choice=NAMED, stream=True, **body))
            out["named, streamed"] = judge(*streamed(chunks), {"get_time"})
        except openai.APIError as exc:
            out["named, streamed"] = f"error {str(exc)[:120]}"
    return out


def main() -> None:
    import fetch
    import llamaplug as lp
    from llamaplug.catalog import default_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--templates", nargs="*", default=[],
                    help="only the templates whose file name contains one of these (case-insensitive)")
    ap.add_argument("--llama-server", action="store_true",
                    help="also ask the pin's llama-server (native_tools) the same; its answer is kept where it differs")
    ap.add_argument("--out", default=str(HERE / "results" / "tool_choice" /
                                         f"sweep-{time.strftime('%Y-%m-%dT%H%M')}.json"))
    args = ap.parse_args()
    templates = sorted((fetch.materialise() / "models" / "templates").glob("*.jinja"))
    if args.templates:
        templates = [p for p in templates if any(w.lower() in p.name.lower() for w in args.templates)]
    results: dict[str, dict[str, str]] = {}
    params = lp.LlamaParams(model_path=default_model("smollm2-135m-instruct"), n_ctx=8192, n_threads=args.threads)
    with lp.Llama.load(params) as llama:
        for path in templates:
            results[path.name] = one(llama, path.read_text(), args.max_tokens)
            if args.llama_server:
                import native_tools

                server = theirs(native_tools.build(), Path(params.model_path), path, args.max_tokens)
                if server != results[path.name]:
                    results[path.name]["llama-server"] = server  # type: ignore[assignment]
            print(f"{path.name}: {results[path.name]}", flush=True)
    tally = Counter(v.split(" (")[0] if v.startswith("call") else v if v == "refused" else "other"
                    for r in results.values() for k, v in r.items() if k != "llama-server")
    print(f"{len(templates)} templates, 2 requests each: {dict(tally)}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"max_tokens": args.max_tokens, "tally": tally, "results": results},
                                         indent=1))
    print(f"saved {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
