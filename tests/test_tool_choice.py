"""tool_choice "required" and a named function make the reply a call (issue 42 part 2), on SmolLM2 with no few-shot
turns, through the library (whole and streamed), the OpenAI route, Anthropic's tool_choice (any, tool), Responses,
Ollama's /api/chat (llamaplug's tool_choice) and the compat layer's chat_format="chatml-function-calling".

llama.cpp's chat layer (so llama-server) builds a "required" grammar that lets text come before the call; SmolLM2
writes that text until max_tokens and no call comes (the pin's llama-server: printed beside ours below).
blocks/tool_choice.py takes the content out of that grammar, so the call starts at once, after a thinking block
where the template has one. The templates: the pin's models/templates files of the main families (Hermes-style
<tool_call>, Llama 3.x's bare JSON, Mistral's [TOOL_CALLS], Qwen 3's optional thinking, and, in the grammar itself,
DeepSeek R1's, whose generation prompt opens a thinking block that SmolLM2 would not close within max_tokens).
On the old code (llama.cpp's grammar as it is) every text of the grammar test is taken."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from llamaplug_testing import llama_server, llamaplug_server

import fetch
import llamaplug as lp
from llamaplug.blocks.chat_layer import ChatTemplates
from llamaplug.blocks.grammar import Grammar

TEMPLATE_DIR = fetch.materialise() / "models" / "templates"
# (template, the request's other fields): Qwen 3's thinking is optional; with enable_thinking false its generation
# prompt holds a closed thinking block, after which the call must start.
CASES = {"qwen2.5": ("Qwen-Qwen2.5-7B-Instruct.jinja", {}),
         "hermes2pro": ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", {}),
         "llama3.1": ("meta-llama-Llama-3.1-8B-Instruct.jinja", {}),
         "mistral-nemo": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", {}),
         "qwen3": ("Qwen-Qwen3-0.6B.jinja", {}),
         "qwen3-no-thinking": ("Qwen-Qwen3-0.6B.jinja", {"chat_template_kwargs": {"enable_thinking": False}})}
R1 = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}}, "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_time"}}
NAMED_WEATHER = {"type": "function", "function": {"name": "get_weather"}}
MAX_TOKENS = 80


def _check_calls(calls: list[tuple[str, str]], names: set[str], one: bool = True) -> None:
    assert len(calls) == 1 if one else calls, calls  # parallel_tool_calls=False: one call
    for name, arguments in calls:
        assert name in names
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def _streamed(chunks: list[Any]) -> tuple[list[tuple[str, str]], str | None]:
    calls: dict[int, list[str]] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            call = calls.setdefault(delta.index, ["", ""])
            if delta.function is not None:
                call[0] += delta.function.name or ""
                call[1] += delta.function.arguments or ""
    finish = next((c.choices[0].finish_reason for c in reversed(chunks) if c.choices), None)
    return [(n, a) for n, a in calls.values()], finish


@pytest.mark.parametrize("case", CASES)
def test_required_and_a_named_function_give_a_call(llama, case):
    name, extra = CASES[case]
    template = (TEMPLATE_DIR / name).read_text()
    given = dict(tools=TOOLS, chat_template=template, max_tokens=MAX_TOKENS, parallel_tool_calls=False, **extra)
    out = llama.create_chat_completion(ASK, tool_choice="required", **given)
    choice = out.choices[0]
    print(f"{name}: required -> {[(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]}")
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    _check_calls([(c.function.name, c.function.arguments) for c in choice.message.tool_calls], set(SCHEMAS))
    calls, finish = _streamed(list(llama.create_chat_completion(ASK, tool_choice=NAMED, stream=True, **given)))
    print(f"{name}: get_time, streamed -> {calls}, {finish}")
    # Mistral's call ends with an "id" string llama.cpp's grammar leaves unbounded, and SmolLM2 wrote digits in it
    # until max_tokens ("length"); the forced call bounds it (tool_choice.py), so the reply ends with the call
    assert finish == "tool_calls"
    _check_calls(calls, {"get_time"})


def test_a_template_that_opens_thinking_calls_after_its_budget(llama):
    """Cohere2MoE's generation prompt opens its thinking block ("...<|CHATBOT_TOKEN|><|START_THINKING|>"): the
    forced call comes after the thinking, which SmolLM2 ends only by the reasoning budget. For SmolLM2 the prompt's
    "|><|" is one token, so the budget never found its start tag in the prompt: it thought until max_tokens with no
    call (bench/tool_choice_sweep.py); the budget now reads the tag on its own. The call's "tool_call_id" is then
    bounded: SmolLM2 wrote digits in it until max_tokens."""
    # 160: SmolLM2 spells Cohere's markup a character or two a token (the call alone is ~100 tokens)
    given = dict(tools=TOOLS, chat_template=(TEMPLATE_DIR / "Cohere2MoE.jinja").read_text(), max_tokens=160,
                 parallel_tool_calls=False, reasoning_budget_tokens=8)
    choice = llama.create_chat_completion(ASK, tool_choice="required", **given).choices[0]
    assert choice.message.reasoning_content and choice.finish_reason == "tool_calls", choice.message
    _check_calls([(c.function.name, c.function.arguments) for c in choice.message.tool_calls], set(SCHEMAS))
    calls, finish = _streamed(list(llama.create_chat_completion(ASK, tool_choice=NAMED, stream=True, **given)))
    assert finish == "tool_calls"
    _check_calls(calls, {"get_time"})


def test_a_call_cut_by_max_tokens_ends_as_length(llama):
    """A reply cut inside its call is "length", whole and streamed, as llama-server answers (finish_reason is
    "tool_calls" only for a reply that ended by itself); it was "tool_calls" with half-written arguments."""
    # 20 tokens: SmolLM2's call is named and its arguments begun ('{'), not finished
    given = dict(tools=TOOLS, chat_template=(TEMPLATE_DIR / CASES["qwen2.5"][0]).read_text(), max_tokens=20,
                 tool_choice="required")
    choice = llama.create_chat_completion(ASK, **given).choices[0]
    assert choice.message.tool_calls and choice.finish_reason == "length"
    calls, finish = _streamed(list(llama.create_chat_completion(ASK, stream=True, **given)))
    assert calls and finish == "length"


class _Force:
    """A plugin sampler that writes `tokens` (the chain's grammar, applied after it, takes them): a reply that does
    not depend on the model's judgement."""

    def __init__(self, tokens: list[int]):
        self.tokens, self.at = tokens, 0

    def apply(self, c: Any) -> None:
        if self.at < len(self.tokens):
            c.logits[c.ids != self.tokens[self.at]] = -float("inf")
            c.logits[c.ids == self.tokens[self.at]] = 10.0

    def accept(self, token: int) -> None:
        self.at += 1


@pytest.fixture(scope="module")
def shallow(shallow_smollm2_path):
    """SmolLM2 cut to its first layer, for replies a sampler forces."""
    with lp.Llama.load(lp.LlamaParams(model_path=shallow_smollm2_path, n_ctx=2048, n_threads=2)) as instance:
        yield instance


def test_a_reply_cut_inside_a_character_is_read_on_whole_characters(shallow):
    """max_tokens that cuts a reply inside a character of DeepSeek V3.1's "<｜tool▁calls▁end｜>" (SmolLM2 spells
    "｜" a byte a token): the text ended in U+FFFD, which is not the start of that markup, and llama.cpp's parser
    refused the reply (whole: the call came back as content; streamed: an error; bench/tool_choice_sweep.py, 160
    tokens). The reply is read on its whole characters, as llama-server's stream never sends an incomplete one:
    the call, whole and streamed, "length". On the old code: no tool_calls whole, a ChatTemplateError streamed."""
    template = (TEMPLATE_DIR / "deepseek-ai-DeepSeek-V3.1.jinja").read_text()
    reply = ('x</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "UTC"}'
             '<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    tokens = shallow.model.tokenize(reply, False, False)
    pieces = [shallow.model.token_to_piece(t) for t in tokens]
    # the longest cut whose bytes end inside a character
    cut = next(n for n in range(len(tokens) - 1, 0, -1) if not _whole_utf8(b"".join(pieces[:n])))
    given = dict(tools=TOOLS, chat_template=template, max_tokens=cut, tool_choice=NAMED, parallel_tool_calls=False)
    choice = shallow.create_chat_completion(ASK, sampler=lp.SamplerChain().add(_Force(tokens)).greedy(),
                                            **given).choices[0]
    assert choice.finish_reason == "length" and not choice.message.content, choice.message
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
    assert calls == [("get_time", {"zone": "UTC"})], choice.message
    calls, finish = _streamed(list(shallow.create_chat_completion(
        ASK, sampler=lp.SamplerChain().add(_Force(tokens)).greedy(), stream=True, **given)))
    assert [(n, json.loads(a)) for n, a in calls] == [("get_time", {"zone": "UTC"})] and finish == "length"


def _whole_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


QWEN_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
GPT_OSS_CALL = ' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Paris"}'
GPT_OSS_THINK = "<|channel|>analysis<|message|>Call get_weather.<|end|><|start|>assistant"
GLM_CALL = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n{}</tool_call>"
KIMI_CALL = ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:{}<|tool_call_argument_begin|>'
             '{{"city": "Paris"}}<|tool_call_end|><|tool_calls_section_end|>')
MUSE_CALL = (' to={}<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n{}</atem:invoke>\n'
             '</atem:function_calls>')
MUSE_CITY = '<atem:parameter name="city">Paris</atem:parameter>\n'
K3_CALL = ('x<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool="get_weather"<|sep|>{}<|close|>call<|sep|>'
           '<|close|>tools<|sep|>')
K3_CITY = '<|open|>argument key="city"<|sep|>Paris<|close|>argument<|sep|>'
R1_CALL = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n'
           '```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')


@pytest.mark.parametrize("name,takes,refuses", [
    (CASES["qwen2.5"][0], [QWEN_CALL], ["Sure! " + QWEN_CALL, QWEN_CALL + "\n" + QWEN_CALL]),
    # DeepSeek R1's generation prompt opens <think>: the thinking goes on until </think>, then the call
    (R1, ["I will call get_weather.</think>" + R1_CALL], ["</think>Sure! " + R1_CALL]),
    # gpt-oss: one analysis block may come first; its commentary preamble (content) and a second analysis may not
    # (SmolLM2 wrote preambles, then analysis blocks, until max_tokens: bench/tool_choice_sweep.py)
    ("openai-gpt-oss-120b.jinja", [GPT_OSS_CALL, GPT_OSS_THINK + GPT_OSS_CALL],
     ["<|channel|>commentary<|message|>Sure!<|end|><|start|>assistant" + GPT_OSS_CALL,
      GPT_OSS_THINK + GPT_OSS_THINK + GPT_OSS_CALL]),
    # GLM: llama.cpp's parser reads the function up to a lookahead at "</tool_call>" and refuses whitespace before
    # it, which its grammar's `space` takes (SmolLM2 wrote "\n\n" there: the reply was a parse error)
    ("GLM-4.6.jinja", [GLM_CALL.format("")], [GLM_CALL.format("\n"), GLM_CALL.format(" ")]),
    # Kimi-K2's call index is bounded (SmolLM2 wrote digits after "functions.get_weather:" until max_tokens)
    ("moonshotai-Kimi-K2.jinja", [KIMI_CALL.format("0"), KIMI_CALL.format("9" * 16)], [KIMI_CALL.format("9" * 17)]),
    # muse-glimmer: the recipient is the function (SmolLM2 wrote one until max_tokens), each parameter once and the
    # required ones always (it wrote city six times)
    ("muse-glimmer.jinja", [MUSE_CALL.format("get_weather", MUSE_CITY)],
     [MUSE_CALL.format("tools.weather", MUSE_CITY), MUSE_CALL.format("get_weather", MUSE_CITY * 2),
      MUSE_CALL.format("get_weather", "")]),
    # Kimi-K3: each argument once (SmolLM2 wrote city twice, after the thinking the prompt opens), one call
    ("Kimi-K3.jinja", [K3_CALL.format(K3_CITY)], [K3_CALL.format(K3_CITY * 2), K3_CALL.format(""), K3_CALL.format(
        K3_CITY + '<|close|>call<|sep|><|open|>call tool="get_weather"<|sep|>' + K3_CITY)]),
])
def test_the_grammar_starts_at_the_call_after_the_thinking(llama, name, takes, refuses):
    """What the requests above rely on, in the grammar itself (llama.cpp's takes every text here): no text
    before the call but the thinking block, and with parallel_tool_calls false no second call."""
    templates = ChatTemplates(llama.model, (TEMPLATE_DIR / name).read_text())
    params = templates.apply({"messages": ASK, "tools": [WEATHER], "tool_choice": "required",
                              "parallel_tool_calls": False})
    grammar = Grammar.from_string(params["grammar"])
    for text in takes:
        assert _accepts(llama, grammar, params["generation_prompt"] + text), text
    for text in refuses:
        assert not _accepts(llama, grammar, params["generation_prompt"] + text), text
    templates.close()


NEMO_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123def"}'
K3_TWO = K3_CITY + '<|close|>call<|sep|><|open|>call tool="get_weather"<|sep|>' + K3_CITY
# (template, one call, two calls): the JSON call lists of the per-call formats (Hermes-style <tool_call>: Qwen 2.5,
# Hermes 2 Pro, llamaplug's chatml-tools), one JSON array (Mistral Nemo) and Kimi-K3's list of functions
ONE_CALL_CASES = {"qwen2.5": (CASES["qwen2.5"][0], QWEN_CALL, QWEN_CALL + "\n" + QWEN_CALL),
                  "hermes2pro": (CASES["hermes2pro"][0], QWEN_CALL, QWEN_CALL + "\n" + QWEN_CALL),
                  "chatml-tools": ("chatml-tools", QWEN_CALL, QWEN_CALL + "\n" + QWEN_CALL),
                  "mistral-nemo": (CASES["mistral-nemo"][0], f"[TOOL_CALLS][{NEMO_CALL}]",
                                   f"[TOOL_CALLS][{NEMO_CALL}, {NEMO_CALL}]"),
                  "kimi-k3": ("Kimi-K3.jinja", K3_CALL.format(K3_CITY), K3_CALL.format(K3_TWO))}


@pytest.mark.parametrize("case", ONE_CALL_CASES)
def test_a_named_function_is_one_call_whatever_parallel_tool_calls_says(llama, case):
    """OpenAI's named tool_choice is "call exactly one specific function"; "required" is one or more. A named
    function was "required" over that tool with the template's parallel_tool_calls default (true for these), so the
    grammar took a list of calls: compat's chat_format="chatml-tools" gave 3 identical get_time calls (issue 48,
    walk-through a15). A named function's grammar now takes one call, parallel_tool_calls unset or true;
    "required" still takes several unless parallel_tool_calls is false. On the old code the named grammar takes two."""
    from llamaplug.high.chat_plan import ChatSpec, plan_chat

    name, one, two = ONE_CALL_CASES[case]
    template = name if name == "chatml-tools" else (TEMPLATE_DIR / name).read_text()
    for choice, parallel, takes_two in ((NAMED_WEATHER, None, False), (NAMED_WEATHER, True, False),
                                        ("required", None, True), ("required", False, False)):
        params = plan_chat(llama, ChatSpec(ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel,
                                           chat_template=template)).params
        grammar = Grammar.from_string(params["grammar"])
        assert _accepts(llama, grammar, params["generation_prompt"] + one), (choice, parallel)
        assert _accepts(llama, grammar, params["generation_prompt"] + two) is takes_two, (choice, parallel)


def _accepts(llama: lp.Llama, grammar: Grammar, text: str) -> bool:
    """Whether `grammar` takes the tokens of `text` (llama.cpp's grammar reads them as a prefill)."""
    tokens = llama.model.tokenize(text, False, True)
    try:
        lp.SamplerChain().grammar(grammar, prefill=tokens).greedy().prepare(llama.model).close()
    except lp.SamplingError:
        return False
    return True


@pytest.fixture(scope="module")
def served(smollm2_path):
    template = TEMPLATE_DIR / CASES["qwen2.5"][0]
    with llamaplug_server(smollm2_path, "-np", "1", "-c", "2048", "--spec-type", "none", "--chat-template-file",
                          str(template)) as (port, _):
        yield port


def test_the_openai_route_gives_a_call(served, smollm2_path, native_tools):
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{served}/v1", api_key="unused", max_retries=0, timeout=600)
    body: dict[str, Any] = dict(model="m", messages=ASK, tools=TOOLS, max_tokens=MAX_TOKENS, parallel_tool_calls=False)
    out = client.chat.completions.create(tool_choice="required", **body)
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls" and not message.content
    _check_calls([(c.function.name, c.function.arguments) for c in message.tool_calls], set(SCHEMAS))
    calls, finish = _streamed(list(client.chat.completions.create(tool_choice=NAMED, stream=True, **body)))
    assert finish == "tool_calls"
    _check_calls(calls, {"get_time"})
    template = TEMPLATE_DIR / CASES["qwen2.5"][0]
    with llama_server(native_tools, smollm2_path, "-c", "2048", "--jinja", "--chat-template-file",
                      str(template)) as port:
        theirs = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                               timeout=600).chat.completions.create(tool_choice="required", **body).choices[0]
    print(f"llama-server, tool_choice required: finish_reason {theirs.finish_reason!r}, tool_calls "
          f"{theirs.message.tool_calls}, content {theirs.message.content!r}; llamaplug: "
          f"{[(c.function.name, c.function.arguments) for c in message.tool_calls]}")


@pytest.mark.parametrize("choice,names", [({"type": "any"}, set(SCHEMAS)),
                                          ({"type": "tool", "name": "get_time"}, {"get_time"}),
                                          ({"type": "any", "disable_parallel_tool_use": True}, set(SCHEMAS))])
def test_anthropic_tool_choice_gives_a_tool_use(served, choice, names):
    import anthropic

    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{served}", api_key="unused", max_retries=0,
                                 timeout=600)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    out = client.messages.create(model="m", max_tokens=MAX_TOKENS, messages=ASK, tools=tools, tool_choice=choice)
    uses = [b for b in out.content if b.type == "tool_use"]
    print(f"Anthropic tool_choice {choice}: {[(u.name, u.input) for u in uses]}")
    # The reply starts at a call; more calls may follow (the last cut by max_tokens) unless parallel use is off or a
    # tool is named (one tool_use, as OpenAI's named function: SmolLM2 wrote two before)
    assert out.content and out.content[0].type == "tool_use", out.content
    if choice.get("disable_parallel_tool_use") or choice["type"] == "tool":
        assert len(uses) == 1 and out.stop_reason == "tool_use", out.content
    assert out.stop_reason in ("tool_use", "max_tokens")
    _check_calls([(u.name, json.dumps(u.input)) for u in uses[:1]], names)


def test_responses_tool_choice_gives_a_call(served):
    """Responses' tool_choice ("required", {"type": "function", "name": ...}), whole and streamed."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{served}/v1", api_key="unused", max_retries=0, timeout=600)
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    body: dict[str, Any] = dict(model="m", input=ASK[0]["content"], tools=tools, max_output_tokens=MAX_TOKENS,
                                parallel_tool_calls=False, store=False)
    out = client.responses.create(tool_choice="required", **body)
    calls = [(i.name, i.arguments) for i in out.output if i.type == "function_call"]
    print(f"Responses required -> {calls}, {out.usage.output_tokens} tokens")
    assert out.status == "completed" and [i.type for i in out.output] == ["function_call"], out.output
    _check_calls(calls, set(SCHEMAS))
    events = list(client.responses.create(tool_choice={"type": "function", "name": "get_time"}, stream=True, **body))
    done = events[-1].response
    assert events[-1].type == "response.completed" and [i.type for i in done.output] == ["function_call"]
    _check_calls([(i.name, i.arguments) for i in done.output], {"get_time"})


def test_ollama_tool_choice_gives_a_call(served, smollm2_path):
    """llamaplug's tool_choice on Ollama's /api/chat (Ollama has none), whole and streamed (NDJSON lines)."""
    import httpx

    body = {"model": smollm2_path.stem, "messages": ASK, "tools": TOOLS, "options": {"num_predict": MAX_TOKENS}}
    out = httpx.post(f"http://127.0.0.1:{served}/api/chat", json={**body, "tool_choice": "required", "stream": False},
                     timeout=600).json()
    calls = [(c["function"]["name"], json.dumps(c["function"]["arguments"])) for c in out["message"].get("tool_calls",
                                                                                                         [])]
    print(f"Ollama required -> {calls}")
    # The reply starts at a call (no content); more calls may follow, the last cut by num_predict (Ollama has no
    # parallel_tool_calls): the first is checked.
    assert calls and not out["message"]["content"], out
    _check_calls(calls[:1], set(SCHEMAS))
    with httpx.stream("POST", f"http://127.0.0.1:{served}/api/chat", json={**body, "tool_choice": NAMED},
                      timeout=600) as resp:
        lines = [json.loads(line) for line in resp.iter_lines() if line]
    assert lines[-1]["done"] and not "".join(line["message"]["content"] for line in lines)
    calls = [(c["function"]["name"], json.dumps(c["function"]["arguments"]))
             for line in lines for c in line["message"].get("tool_calls", [])]
    _check_calls(calls, {"get_time"})  # a named function: one call


def test_compat_chatml_function_calling_with_a_named_tool_choice(smollm2_path):
    """llama-cpp-python's documented way: chat_format="chatml-function-calling" and a named tool_choice, no few-shot
    turns (it returned text before blocks/tool_choice.py). One call: a named function is "call exactly one" (on the
    old code SmolLM2 wrote the same get_time call twice here, 3 times with max_tokens=200: issue 48, a15)."""
    from llamaplug.compat import llama_cpp as compat

    with compat.Llama(str(smollm2_path), n_ctx=1024, verbose=False, chat_format="chatml-function-calling") as llm:
        out = llm.create_chat_completion(ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=MAX_TOKENS)["choices"][0]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in out["message"]["tool_calls"] or []]
        print(f"compat chatml-function-calling, get_time -> {calls}")
        assert out["finish_reason"] == "tool_calls" and not out["message"]["content"], out
        _check_calls(calls, {"get_time"})
        assert out["message"]["function_call"]["name"] == "get_time"  # llama-cpp-python's legacy field too


# A forced call's raw-text string argument (XML-style formats), as each format writes get_time(zone=...) (llama.cpp's
# parser reads each with "UTC" as {"zone": "UTC"}: asserted below), and the start of the format's own close.
XML_CALLS = {
    # the close of the value is an `ac` that holds "\n</parameter>\n"
    "Qwen3-Coder.jinja": ("<tool_call>\n<function=get_time>\n<parameter=zone>\n{}\n</parameter>\n</function>\n"
                          "</tool_call>", "</p"),
    # an `until` the close follows in the grammar; the generation prompt opens the thinking
    "deepseek-ai-DeepSeek-V3.2.jinja": ('</think><｜DSML｜function_calls>\n<｜DSML｜invoke name="get_time">\n<｜DSML｜'
                                       'parameter name="zone" string="true">{}</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
                                       '</｜DSML｜function_calls>', "</｜"),
    # markup that begins with "]<]", not a tag
    "MiniMax-M3.jinja": (']<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="get_time">\n]<]minimax[>[<zone>{}'
                         ']<]minimax[>[</zone>\n]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>', "]<]"),
}


@pytest.mark.parametrize("name", XML_CALLS)
def test_a_forced_raw_text_argument_holds_no_markup_and_keeps_its_max_length(llama, name):
    """The XML-style formats read a string argument as raw text up to its closing tag, and llama.cpp's grammar lets
    any text (maxLength ignored) come before that close: SmolLM2 wrote "UTC</parameter>" (no newline before the
    close), the schema's "<type>string</type>" or "<#1>", and the markup became the argument
    (bench/tool_choice_sweep.py: 12 templates). In a forced call "<" in the value is followed by whitespace only, the
    value begins none of the format's markup and holds at most maxLength characters; a valid call is taken as before,
    "a < b" included. llama.cpp's grammar takes
    every text here (on the old code the test fails at "UTC</time>")."""
    from llamaplug.blocks.chat_layer import parse_reply, parser_params

    templates = ChatTemplates(llama.model, (TEMPLATE_DIR / name).read_text())
    params = templates.apply({"messages": ASK, "tools": [TIME], "tool_choice": "required",
                              "parallel_tool_calls": False})
    call, close = XML_CALLS[name]
    assert parse_reply(parser_params(params), call.format("UTC"))["tool_calls"][0]["arguments"] == '{"zone":"UTC"}'
    grammar = Grammar.from_string(params["grammar"])
    for value in ("UTC", "Europe/Paris", "a < b"):  # maxLength 12
        assert _accepts(llama, grammar, params["generation_prompt"] + call.format(value)), value
    # "\n\n", " UTC" and "< type=date>": whitespace first, or "<" (SmolLM2 wrote the first and the last)
    for value in ("UTC</time>", "<type>string", "<#1>", "UTC" + close, "ABCDEFGHIJKLM", "\n\n", " UTC", "< type=date>"):
        assert not _accepts(llama, grammar, params["generation_prompt"] + call.format(value)), value
    templates.close()


PLACE = {"type": "function", "function": {"name": "place", "description": "A place", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                                     "street": {"type": "string"}}, "required": ["city", "country"]}}}


def test_a_forced_python_style_call_names_each_argument_once(llama):
    """LFM2's calls are python-style (`[get_time(zone="UTC")]`) and llama.cpp's grammar lists the arguments as
    `arg ("," space arg)*`, any argument any number of times: SmolLM2 repeated a key (bench/tool_choice_sweep.py:
    LFM2 x3). In a forced call each argument comes at most once and the required ones always, in any order. On the
    old code the test fails at the repeated zone."""
    from llamaplug.blocks.chat_layer import parse_reply, parser_params

    templates = ChatTemplates(llama.model, (TEMPLATE_DIR / "LFM2-8B-A1B.jinja").read_text())
    params = templates.apply({"messages": ASK, "tools": [TIME, PLACE], "tool_choice": "required",
                              "parallel_tool_calls": False})
    grammar = Grammar.from_string(params["grammar"])

    def call(text: str) -> str:
        return f"<|tool_call_start|>[{text}]<|tool_call_end|>"

    assert parse_reply(parser_params(params), call('get_time(zone="UTC")'))["tool_calls"][0]["arguments"] == \
        '{"zone":"UTC"}'
    for text in ('get_time(zone="UTC")', 'place(city="Paris", country="FR")', "place(country='FR', city='Paris')",
                 'place(street="Rue", city="Paris", country="FR")'):
        assert _accepts(llama, grammar, params["generation_prompt"] + call(text)), text
    for text in ('get_time(zone="UTC", zone="CET")', 'place(city="Paris", city="Lyon", country="FR")',
                 'place(city="Paris")', 'place(city="Paris", street="Rue")'):
        assert not _accepts(llama, grammar, params["generation_prompt"] + call(text)), text
    templates.close()


def test_a_forced_gemma4_call_has_its_schemas_keys_and_value_types(llama):
    """Gemma 4 writes the arguments as its own dict (`call:get_time{zone:<|"|>UTC<|"|>}`) and llama.cpp's grammar
    takes any dict there: SmolLM2 wrote keys and values the schema does not have (bench/tool_choice_sweep.py: Gemma 4
    x2). In a forced call the dict holds the schema's keys, each at most once, the required ones always, in any order,
    each value of its type. On the old code the test fails at the unknown key."""
    from llamaplug.blocks.chat_layer import parse_reply, parser_params

    templates = ChatTemplates(llama.model, (TEMPLATE_DIR / "google-gemma-4-31B-it.jinja").read_text())
    params = templates.apply({"messages": ASK, "tools": [TIME, PLACE], "tool_choice": "required",
                              "parallel_tool_calls": False})
    grammar = Grammar.from_string(params["grammar"])

    def call(name: str, args: str) -> str:
        return f"<|tool_call>call:{name}{{{args}}}<tool_call|>"

    s = '<|"|>{}<|"|>'.format
    assert parse_reply(parser_params(params), call("get_time", "zone:" + s("UTC")))["tool_calls"][0]["arguments"] \
        == '{"zone":"UTC"}'
    # a newline inside the quotes is the value's, not markup: llama.cpp's parser reads it back as written (SmolLM2
    # wrote "ZonE:\n"; bench/tool_choice_sweep.py no longer counts it as markup), and the schema takes it
    assert parse_reply(parser_params(params), call("get_time", "zone:" + s("ZonE:\n")))["tool_calls"][0][
        "arguments"] == '{"zone":"ZonE:\\n"}'
    for name, args in (("get_time", "zone:" + s("UTC")), ("place", f"city:{s('Paris')},country:{s('FR')}"),
                       ("place", f"country:{s('FR')}, street:{s('Rue')},city:{s('Paris')}"),
                       ("get_time", "zone:" + s("ZonE:\n"))):
        assert _accepts(llama, grammar, params["generation_prompt"] + call(name, args)), args
    for name, args in (("get_time", "time:" + s("UTC")), ("get_time", "zone:5"), ("get_time", ""),
                       ("get_time", f"zone:{s('UTC')},zone:{s('CET')}"), ("get_time", "zone:" + s("ABCDEFGHIJKLM")),
                       ("place", f"city:{s('Paris')}")):
        assert not _accepts(llama, grammar, params["generation_prompt"] + call(name, args)), args
    templates.close()


@pytest.mark.parametrize("name,tag", [("openai-gpt-oss-120b.jinja", "<|channel|>analysis<|message|>"),
                                      ("MiniMax-M3.jinja", "<mm:think>")])
def test_with_a_reasoning_budget_the_thinking_tag_is_the_tokens_the_budget_sees(llama, name, tag):
    """gpt-oss's and MiniMax-M3's replies open their thinking themselves, and the reasoning budget (llama.cpp's, as
    llama-server's) starts at the tag's own tokens; SmolLM2 spelled the tag in other tokens ("<|c ha nn e l|>..."),
    the budget never started and the forced call never came (bench/tool_choice_sweep.py: gpt-oss named and MiniMax-M3
    required thought until max_tokens with a budget of 16). With a budget the grammar takes the tag as those tokens
    only; without one, as llama.cpp wrote it. On the old code the other spelling is taken with the budget too."""
    from llamaplug.high.chat_call import ChatCall, ChatRun
    from llamaplug.high.chat_plan import ChatSpec

    template = (TEMPLATE_DIR / name).read_text()
    tokenize = llama.model.tokenize
    spelled = [t for ch in tag for t in tokenize(ch, False, True)]  # a character a token
    assert spelled != tokenize(tag, False, True)
    for budget in (16, None):
        run = ChatRun(llama, ChatCall(ChatSpec(ASK, tools=TOOLS, tool_choice=NAMED, parallel_tool_calls=False,
                                               chat_template=template, reasoning_budget_tokens=budget), max_tokens=1))
        params = run.prepare().plan.params
        run.close()
        grammar = Grammar.from_string(params["grammar"])
        prompt = tokenize(params["generation_prompt"], False, True)
        assert _accepts_tokens(llama, grammar, prompt + tokenize(tag, False, True)), budget
        assert _accepts_tokens(llama, grammar, prompt + spelled) is (budget is None)


def _accepts_tokens(llama: lp.Llama, grammar: Grammar, tokens: list[int]) -> bool:
    try:
        lp.SamplerChain().grammar(grammar, prefill=tokens).greedy().prepare(llama.model).close()
    except lp.SamplingError:
        return False
    return True


def test_a_forced_muse_glimmer_call_bounds_each_of_several_arguments(llama):
    """muse-glimmer writes a function's parameters inline (`<atem:parameter name="city">...</atem:parameter>`), and
    for a function with several its rule reads every value with one shared rule: any text up to the close, markup
    and length unchecked (the one-argument case was bounded in 33c4082). In a forced call each string value opens no
    markup, begins with no blank and keeps its maxLength, as the other XML-style formats' (see above). On the old
    code the test fails at "<b>Paris"."""
    place = json.loads(json.dumps(PLACE))
    place["function"]["parameters"]["properties"]["city"]["maxLength"] = 12
    templates = ChatTemplates(llama.model, (TEMPLATE_DIR / "muse-glimmer.jinja").read_text())
    params = templates.apply({"messages": ASK, "tools": [place, TIME], "tool_choice": "required",
                              "parallel_tool_calls": False})
    grammar = Grammar.from_string(params["grammar"])

    def call(city: str, country: str = "FR") -> str:
        return MUSE_CALL.replace("get_weather", "place").format(
            "place", f'<atem:parameter name="city">{city}</atem:parameter>\n'
                     f'<atem:parameter name="country">{country}</atem:parameter>\n')

    from llamaplug.blocks.chat_layer import parse_reply, parser_params
    assert json.loads(parse_reply(parser_params(params), call("Paris"))["tool_calls"][0]["arguments"]) == \
        {"city": "Paris", "country": "FR"}
    for city in ("Paris", "Europe/Paris", "a < b"):
        assert _accepts(llama, grammar, params["generation_prompt"] + call(city)), city
    for city, country in (("<b>Paris", "FR"), ("Paris", "<type>string"), ("ABCDEFGHIJKLM", "FR"), ("\n\nParis", "FR"),
                          ("Paris", " FR")):
        assert not _accepts(llama, grammar, params["generation_prompt"] + call(city, country)), (city, country)
    templates.close()


def test_a_forced_ling3_call_keeps_the_close_of_its_values(llama):
    """Ling 3 reads a value with a shared rule that holds its close (`ling3-arg-string ::= until-N "</arg_value>"`).
    The forced call's bounded value took that rule's place without the close, so the grammar refused the template's
    own rendering of a call and let `<arg_value>Paris</tool_call>` through, which llama.cpp's parser reads as an
    unterminated value (the whole sweep of this stop: `{"city":"Paris</tool_call>\\n`, both ways). On the old code
    both asserts fail."""
    templates = ChatTemplates(llama.model, (TEMPLATE_DIR / "inclusionai-ling-3.0-flash.jinja").read_text())
    params = templates.apply({"messages": ASK, "tools": TOOLS, "tool_choice": "required"})
    grammar = Grammar.from_string(params["grammar"])
    call = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
    from llamaplug.blocks.chat_layer import parse_reply, parser_params
    assert parse_reply(parser_params(params), call)["tool_calls"][0]["arguments"] == '{"city":"Paris"}'
    assert _accepts(llama, grammar, params["generation_prompt"] + call)
    assert not _accepts(llama, grammar, params["generation_prompt"] +
                        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</tool_call>")


def test_a_template_that_renders_no_call_refuses_a_forced_one(llama):
    """Granite 3.3's template shows the tools and asks for "<|tool_call|>" in prose, but renders no call: llama.cpp's
    chat layer finds no call format in it, so a "required" reply has no grammar and a call would not be read
    (bench/tool_choice_sweep.py: text until max_tokens). A forced call is refused before generation; "auto" is
    rendered as llama-server renders it."""
    given = dict(tools=TOOLS, chat_template=(TEMPLATE_DIR / "ibm-granite-granite-3.3-2B-Instruct.jinja").read_text(),
                 max_tokens=1)
    for choice in ("required", NAMED):
        with pytest.raises(lp.InvalidParameterError, match="no tool-call format") as caught:
            llama.create_chat_completion(ASK, tool_choice=choice, **given)
        assert caught.value.field == "tool_choice"
    assert llama.create_chat_completion(ASK, tool_choice="auto", **given).choices[0].finish_reason == "length"
