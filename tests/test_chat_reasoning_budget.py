"""The reasoning budget as llama-server has it: --reasoning-budget / --reasoning-budget-message, and a request's
reasoning_budget_tokens (thinking_budget_tokens, Anthropic's thinking.budget_tokens) and reasoning_budget_message.

The reference is the pin's llama-server, greedy on SmolLM2 with a template whose generation prompt opens the
thinking (QwQ's `<think>\\n`), so the budget is spent by what the model writes: the same reply, thinking and
answer, whole and streamed, with the budget per request and from the flags. For a template where the model opens
the thinking itself (Qwen3's), a sampler writes the `<think>` and the budget's meaning is checked token by token:
N tokens of thinking, then the message and the end tag; 0 none; -1 as without a budget.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request

import pytest
from llamaplug_testing.servers import llama_server, llamaplug_server, post_json
from llamaplug_testing.settings import THREADS

import fetch
import llamaplug as lp
from llamaplug.high.chat import ChatSpec
from llamaplug.high.chat_call import ChatCall, start_chat

TEMPLATES = fetch.materialise() / "models" / "templates"
OPENS = TEMPLATES / "Qwen-QwQ-32B.jinja"  # its generation prompt ends with "<think>\n"
QWEN3 = TEMPLATES / "Qwen-Qwen3-0.6B.jinja"  # the model writes "<think>" itself
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
NOTE = "Time is up."
MAX = 24
# (reasoning_budget_tokens, reasoning_budget_message): unlimited, none, spent by the prompt's "\n", a few tokens
CASES = [(-1, None), (0, None), (1, None), (4, None), (4, NOTE), (0, NOTE)]


@pytest.fixture(scope="module")
def model(smollm2_path):
    with lp.Llama.load(lp.LlamaParams(model_path=smollm2_path, n_ctx=2048, n_threads=THREADS)) as llama:
        yield llama


def _fields(budget: int, note: str | None, name: str = "reasoning_budget_tokens") -> dict:
    return {name: budget, **({} if note is None else {"reasoning_budget_message": note})}


def _ours(model, template: str, stream: bool, **fields) -> tuple[str, str]:
    out = model.create_chat_completion(MESSAGES, max_tokens=MAX, chat_template=template, stream=stream, **fields)
    if not stream:
        message = out.choices[0].message
        return message.reasoning_content or "", message.content or ""
    reasoning, content = "", ""
    for chunk in out:
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None:
            reasoning += delta.reasoning_content or ""
            content += delta.content or ""
    return reasoning, content


def _theirs(port: int, path: str = "/v1/chat/completions", **fields) -> tuple[str, str]:
    out = post_json(port, path, {"messages": MESSAGES, "max_tokens": MAX, "temperature": 0, **fields})
    message = out["choices"][0]["message"]
    return message.get("reasoning_content") or "", message.get("content") or ""


def test_a_requests_budget_ends_the_thinking_as_llama_servers(model, native_tools, smollm2_path):
    template = OPENS.read_text()
    seen = {}
    with llama_server(native_tools, smollm2_path, "-c", "2048", "--chat-template-file", str(OPENS)) as port:
        for budget, note in CASES:
            theirs = _theirs(port, **_fields(budget, note))
            for stream in (False, True):
                assert _ours(model, template, stream, **_fields(budget, note)) == theirs, (budget, note, stream)
            seen[budget, note] = theirs
        # llama-server's other name for the field, and reasoning_budget_tokens winning over it
        assert _theirs(port, thinking_budget_tokens=4) == seen[4, None]
        assert _theirs(port, reasoning_budget_tokens=-1, thinking_budget_tokens=4) == seen[-1, None]
    unlimited = seen[-1, None][0]
    assert len(unlimited) > 20 and not seen[-1, None][1]  # greedy, it thinks past MAX without a budget
    cut = seen[4, None][0]
    assert cut and unlimited.startswith(cut) and len(cut) < len(unlimited)  # cut short, then the answer
    assert seen[4, None][1]
    assert seen[4, NOTE][0].endswith(NOTE) and unlimited.startswith(seen[4, NOTE][0][:-len(NOTE)])
    assert seen[1, None][0] == ""  # the prompt's "\n" after <think> spent the one token


def test_the_flags_set_the_budget_of_requests_that_give_none(native_tools, smollm2_path):
    flags = ["-c", "2048", "--chat-template-file", str(OPENS), "--reasoning-budget", "4",
             "--reasoning-budget-message", NOTE]
    asks = [{}, {"reasoning_budget_tokens": -1}, {"thinking_budget_tokens": 1}, {"reasoning_budget_message": "Stop."}]
    thinking = {"thinking": {"type": "enabled", "budget_tokens": 6}}
    with llama_server(native_tools, smollm2_path, *flags) as port:
        theirs = [_theirs(port, **ask) for ask in asks]
        their_messages = _anthropic(port, thinking)
        their_bad = _status(port, {"messages": MESSAGES, "max_tokens": 4, "reasoning_budget_tokens": -2})
    with llamaplug_server(smollm2_path, "-np", "1", "--spec-type", "none", *flags) as (port, _):
        ours = [_theirs(port, **ask) for ask in asks]
        our_messages = _anthropic(port, thinking)
        our_bad = _status(port, {"messages": MESSAGES, "max_tokens": 4, "reasoning_budget_tokens": -2})
        our_bad_type = _status(port, {"messages": MESSAGES, "max_tokens": 4, "thinking_budget_tokens": "many"})
    assert ours == theirs
    assert theirs[0][0].endswith(NOTE) and theirs[1] == theirs[0] and theirs[2][0].strip() == NOTE
    assert theirs[3][0].endswith("Stop.")
    assert our_messages == their_messages and their_messages[0]["type"] == "thinking"
    assert their_bad[0] == our_bad[0] == 400 and our_bad[1]["error"]["param"] == "reasoning_budget_tokens"
    assert our_bad_type[0] == 400 and our_bad_type[1]["error"]["param"] == "thinking_budget_tokens"


def _anthropic(port: int, extra: dict) -> list[dict]:
    out = post_json(port, "/v1/messages", {"model": "m", "messages": MESSAGES, "max_tokens": MAX, "temperature": 0,
                                           **extra})
    return [{k: v for k, v in block.items() if k != "signature"} for block in out["content"]]


def _status(port: int, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class Lead:
    """A Python sampler that keeps only the next token of a given text while there is one, then none of its own."""

    def __init__(self, tokens: list[int]):
        self.tokens, self.at = tokens, 0

    def apply(self, candidates) -> None:
        if self.at < len(self.tokens):
            candidates.logits[candidates.ids != self.tokens[self.at]] = -float("inf")

    def accept(self, token: int) -> None:
        self.at += 1


def _written(model, budget: int | None, note: str | None = None) -> list[int]:
    """The tokens the model writes on Qwen3's template when its reply is led into "<think>"."""
    lead = model.model.tokenize("<think>", False, True)
    sampler = lp.SamplerChain().add(Lead(lead)).greedy()
    spec = ChatSpec(MESSAGES, chat_template=QWEN3.read_text(), reasoning_budget_tokens=budget,
                    reasoning_budget_message=note)
    return start_chat(model, ChatCall(spec, sampler, max_tokens=MAX)).completion().tokens


def test_the_budget_counts_the_tokens_after_a_start_tag_the_model_writes(model):
    tok = model.model
    start = tok.tokenize("<think>", False, True)
    end = tok.tokenize("</think>", False, True)
    free = _written(model, None)
    assert _written(model, -1) == free
    assert free[:len(start)] == start and end[0] not in free[len(start):len(start) + 6]  # it would think on
    for budget in (0, 3):
        got = _written(model, budget)
        at = len(start) + budget  # the budget's tokens, then the end tag forced
        assert got[:at] == free[:at] and got[at:at + len(end)] == end, budget
    noted = _written(model, 3, NOTE)
    forced = tok.tokenize(NOTE, False, True) + end
    assert noted[len(start) + 3:len(start) + 3 + len(forced)] == forced
    out = model.create_chat_completion(MESSAGES, max_tokens=MAX, chat_template=QWEN3.read_text(),
                                       sampler=lp.SamplerChain().add(Lead(start)).greedy(), reasoning_budget_tokens=0)
    assert out.choices[0].message.reasoning_content is None and out.choices[0].message.content  # no thinking


@pytest.mark.parametrize("fields, field", [
    ({"reasoning_budget_tokens": -2}, "reasoning_budget_tokens"),
    ({"reasoning_budget_tokens": 2**31}, "reasoning_budget_tokens"),
    ({"reasoning_budget_tokens": True}, "reasoning_budget_tokens"),
    ({"reasoning_budget_tokens": "3"}, "reasoning_budget_tokens"),
    ({"reasoning_budget_tokens": 1.5}, "reasoning_budget_tokens"),
    ({"reasoning_budget_tokens": 3, "reasoning_budget_message": 5}, "reasoning_budget_message"),
])
def test_a_bad_budget_is_an_error_naming_its_field(model, fields, field):
    with pytest.raises(lp.InvalidParameterError) as info:
        model.create_chat_completion(MESSAGES, max_tokens=2, chat_template=OPENS.read_text(), **fields)
    assert info.value.field == field


def test_a_callers_chain_is_left_as_it_was(model):
    chain = lp.SamplerChain().top_k(1).greedy()
    model.create_chat_completion(MESSAGES, max_tokens=4, chat_template=OPENS.read_text(), sampler=chain,
                                 reasoning_budget_tokens=2)
    assert chain.names == ["top_k", "greedy"]


def test_the_budget_flag_refuses_what_llama_server_refuses(native_tools, smollm2_path):
    import sys

    theirs = subprocess.run([str(native_tools / "llama-server"), "-m", str(smollm2_path), "--reasoning-budget", "-2",
                             "--port", "1"], capture_output=True, text=True, timeout=60)
    ours = subprocess.run([sys.executable, "-m", "llamaplug.cli", "serve", "-m", str(smollm2_path),
                           "--reasoning-budget", "-2"], capture_output=True, text=True, timeout=60)
    assert theirs.returncode != 0 and ours.returncode != 0
    assert "--reasoning-budget" in ours.stderr
