"""Replies of a given text through the whole chat path, and llama.cpp's reference reading of them.

`reference(...)` runs the pin's chat layer (vendor/llama.cpp/reference/chat_reference.cpp, linked to the
tools' libllama-common) on a template: the prompt, the template's own rendering of an assistant message
cut to what a model writes, and that text parsed whole and streamed. `ask(...)` makes the real model
write exactly that text through `Llama.create_chat_completion` (a Python sampler that keeps only the
next token of it, behind the chat layer's grammar and stops) and reads the reply as a user would.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np


def reference(program: Path, model: Path, template: str, request: dict[str, Any], assistant: dict[str, Any],
              reasoning_format: str = "auto", reply: str | None = None) -> dict[str, Any]:
    given = {"template": template, "request": request, "assistant": assistant, "reasoning_format": reasoning_format}
    if reply is not None:  # start from this text instead of the template's rendering of `assistant`
        given["reply"] = reply
    done = subprocess.run([str(program), str(model)], input=json.dumps(given), capture_output=True, text=True,
                          errors="replace", timeout=120, check=True)
    return json.loads(done.stdout)


class Force:
    """A Python sampler that keeps only the next token of a given text, then the end of generation."""

    def __init__(self, tokens: list[int], eos: int):
        self.tokens, self.eos, self.at = tokens, eos, 0

    def apply(self, candidates: Any) -> None:
        want = self.tokens[self.at] if self.at < len(self.tokens) else self.eos
        candidates.logits[candidates.ids != want] = -np.inf

    def accept(self, token: int) -> None:
        self.at += 1


def ask(llama: Any, reply: str, stream: bool, **chat: Any) -> dict[str, Any]:
    """The message `llama` gives when its model writes `reply` (whole, or the stream's deltas joined)."""
    import llamaplug as lp

    tokens = llama.model.tokenize(reply, False, False)
    sampler = lp.SamplerChain().add(Force(tokens, llama.model.eos)).greedy()
    out = llama.create_chat_completion(max_tokens=len(tokens) + 4, sampler=sampler, stream=stream, **chat)
    if not stream:
        message = out.choices[0].message
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]
        return {"content": message.content or "", "reasoning_content": message.reasoning_content or "",
                "tool_calls": calls}
    joined: dict[str, Any] = {"content": "", "reasoning_content": "", "tool_calls": []}
    for chunk in out:
        delta = chunk.choices[0].delta
        joined["content"] += delta.content or ""
        joined["reasoning_content"] += delta.reasoning_content or ""
        for call in delta.tool_calls or []:
            while len(joined["tool_calls"]) <= call.index:
                joined["tool_calls"].append({"name": "", "arguments": ""})
            if call.function is not None:
                joined["tool_calls"][call.index]["name"] += call.function.name or ""
                joined["tool_calls"][call.index]["arguments"] += call.function.arguments or ""
    return joined


def same_message(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    """Equal content, reasoning and calls (arguments compared as JSON)."""
    assert ours["content"] == theirs["content"]
    assert ours["reasoning_content"] == theirs["reasoning_content"]
    assert [c["name"] for c in ours["tool_calls"]] == [c["name"] for c in theirs["tool_calls"]]
    assert [json.loads(c["arguments"]) for c in ours["tool_calls"]] == \
        [json.loads(c["arguments"]) for c in theirs["tool_calls"]]


# A tool and a conversation that make the small test model call it (SmolLM2-135M calls no tool by itself):
# two earlier turns where the assistant wrote such a call in the template's own format, then the question.
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time in a zone", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
CALL_FORMATS = {
    "hermes": '<tool_call>\n{{"name": "get_time", "arguments": {{"zone": "{zone}"}}}}\n</tool_call>',
    "qwen3-coder": ("<tool_call>\n<function=get_time>\n<parameter=zone>\n{zone}\n</parameter>\n</function>\n"
                    "</tool_call>"),
}


def few_shot(call_format: str) -> list[dict[str, Any]]:
    """What-time questions, two answered by a call written in `call_format`, the third open."""
    call = CALL_FORMATS[call_format]
    return [{"role": "user", "content": "What time is it in Rome?"},
            {"role": "assistant", "content": call.format(zone="Europe/Rome")},
            {"role": "user", "content": "What time is it in Oslo?"},
            {"role": "assistant", "content": call.format(zone="Europe/Oslo")},
            {"role": "user", "content": "What time is it in Berlin?"}]
