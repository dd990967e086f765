"""Issue 43 part 4: no grammar overflows llama.cpp's parser; a grammar past a bound is a 400 naming the field.

QA's finding: `root ::= ((((...20,000...("a")...))))` (40 KB) on /completion or a chat request killed the
server (SIGSEGV: the stack of llama.cpp's recursive grammar parser; llama-server dies the same way), and a
200 KB alternation of 20,000 alternatives held every slot ~20 s. blocks/grammar_bounds.py checks the text
first. Each bound is shown refusing (library and server) and real grammars passing: the pin's grammars/,
the chat layer's tool-call grammar and llama.cpp's converter's grammar of a large JSON schema.
"""

from __future__ import annotations

import time

import pytest
from llamaplug_testing.servers import llamaplug_server, post_status

import llamaplug as lp
from llamaplug.blocks.chat_layer import ChatTemplates
from llamaplug.blocks.grammar import Grammar
from llamaplug.blocks.json_schema import schema_to_gbnf
from llamaplug.high.chat import CHATML_TOOLS

DEEP = "root ::= " + "(" * 20000 + '"a"' + ")" * 20000  # QA's 40 KB grammar
WIDE = "root ::= " + " | ".join(f'"w{i:05d}"' for i in range(20000))  # QA's 200 KB alternation
BAD = {
    "nests parentheses deeper than 128 levels": DEEP,
    "more than 4096 alternatives in one rule": WIDE,
    "more than 4096 alternatives in one rule or group": "root ::= x\nx ::= (" + WIDE[9:] + ")",
    # r0 ::= r1 "x", r1 ::= r2 "x", ...: 20,000 overflow a 2 MiB thread's stack in llama.cpp's recursions
    "a chain of rules, each beginning with the next, of more than 4096 levels":
        "\n".join(f'r{i} ::= r{i + 1} "x"' for i in range(20000)) + '\nr20000 ::= "a"',
    "more than 200000 rules": "root ::= " + "[a]? " * 200001,
    "is 4194315 bytes long": 'root ::= "' + "a" * (4 << 20) + '"',
    "repeats items into more than 1000000 symbols": 'root ::= "' + "a" * 1000 + '"{2000}',
}


@pytest.mark.parametrize("bound", list(BAD))
def test_the_library_refuses_a_grammar_past_a_bound_naming_it(bound):
    start = time.monotonic()
    with pytest.raises(lp.InvalidGrammarError, match=bound) as err:
        Grammar.from_string(BAD[bound])
    assert err.value.field == "grammar"
    assert time.monotonic() - start < 15  # a scan (seconds on a loaded 2-core machine for 20,000 rules)


def test_real_grammars_pass(llama_cpp_dir):
    grammars = sorted((llama_cpp_dir / "grammars").glob("*.gbnf"))
    assert len(grammars) >= 8
    for path in grammars:
        Grammar.from_file(path)
    # llama.cpp's converter on a schema of 100 properties, each an object of 20 (2,000 values), one nested 30 deep
    props = {f"p{i}": {"type": "object", "properties": {f"q{j}": {"type": "integer"} for j in range(20)}}
             for i in range(100)}
    deep: dict = {"type": "string"}
    for _ in range(30):
        deep = {"type": "object", "properties": {"x": deep}, "required": ["x"]}
    Grammar.from_string(schema_to_gbnf({"type": "object", "properties": {**props, "deep": deep}}))
    # the chat layer's tool-call grammar for 128 tools (OpenAI's most) of 4 parameters, one nested 5 deep
    nested: dict = {"type": "integer"}
    for _ in range(5):
        nested = {"type": "array", "items": {"type": "object", "properties": {"v": nested, "w": {"type": "string"}}}}
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "d", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}, "b": nested, "c": {"enum": ["x", "y", "z"]},
                                         "d": {"type": "number", "minimum": 0}}, "required": ["a"]}}}
             for i in range(128)]
    params = ChatTemplates(None, CHATML_TOOLS).apply({"messages": [{"role": "user", "content": "hi"}],
                                                      "tools": tools, "tool_choice": "required"})
    assert "tool_127" in params["grammar"]
    Grammar.from_string(params["grammar"])


_post = post_status


@pytest.fixture(scope="module")
def server(smollm2_path):
    with llamaplug_server(smollm2_path, "-c", "1024") as (port, proc):
        yield port, proc


@pytest.mark.parametrize("path,body", [
    ("/completion", {"prompt": "Say a", "n_predict": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say a"}], "max_tokens": 2}),
])
def test_the_server_answers_a_deep_or_wide_grammar_with_a_400_and_stays_up(server, path, body):
    port, proc = server
    for grammar, bound in ((DEEP, "nests parentheses deeper than 128"), (WIDE, "more than 4096 alternatives")):
        start = time.monotonic()
        status, reply = _post(port, path, {**body, "grammar": grammar})
        # the old code: the deep one killed the process (SIGSEGV), the wide one held the slot ~20 s
        assert proc.poll() is None, f"the server died on the grammar ({bound}): rc {proc.returncode}"
        assert status == 400, reply
        error = reply["error"]
        assert bound in error["message"] and error.get("param", "grammar") == "grammar", error
        assert time.monotonic() - start < 5
    status, reply = _post(port, path, {**body, "grammar": 'root ::= "a" | "b"'})
    assert status == 200 and proc.poll() is None
