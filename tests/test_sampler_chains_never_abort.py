"""No sampler chain ends the process (issue 42): random chains through the library and the server.

A grammar sampler throws a C++ exception when it is made to accept a token it refuses ("Unexpected empty
grammar stack after accepting piece"), and a lazy one when the text buffered before its trigger does not
parse once the trigger fires; before the sampling helpers caught it, that exception crossed C frames and
the process aborted (exit 134): a plugin sampler forcing GigaChat3's own rendering of a tool call, or one that
kept writing " and" after Qwen 2.5's finished <tool_call>. Here seeded random chains (plugin samplers forcing
arbitrary tokens or a template's own rendering of a call, logit biases, grammars, lazy grammars, the lazy
tool-call grammars of every template of the pin's models/templates) run in a child interpreter, where an abort
is an exit status that fails the test rather than a dead pytest: every request ends in a reply or a LlamaError.
The server's part sends random logit biases, grammars, JSON schemas and tool requests (templates served from a
models dir) and checks each answer is a reply or an API error and that /health stays 200.
The model is SmolLM2 cut to its first layer (fixture `shallow_smollm2_path`): whether a chain aborts is the
sampling path's doing, with the real vocabulary and templates, not the weights'.
"""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from llamaplug_testing import THREADS, llamaplug_server, post_status, run_isolated

import fetch

TEMPLATES = sorted((fetch.materialise() / "models" / "templates").glob("*.jinja"))
# The templates QA saw abort (issue 42), and Qwen 2.5's ("and" written after a finished call).
ABORTED = ("GigaChat3-10B-A1.8B.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja")

CHILD = """
import json, random, sys, time
from pathlib import Path
import numpy as np
import llamaplug as lp
from llamaplug.blocks.chat_layer import ChatTemplates

model_path, seed, mode, *paths = sys.argv[1:]
t0 = time.perf_counter()
llama = lp.Llama.load(lp.LlamaParams(model_path=model_path, n_ctx=2048, n_threads=%(threads)d))
model = llama.model
print("LOADED %%.2f" %% (time.perf_counter() - t0), flush=True)
n_vocab, eos = model.n_vocab, model.eos
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the weather in Paris?"}]
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call0Abc9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
GRAMMARS = ['root ::= "yes" | "no"', 'root ::= [a-z]+ "." ', 'root ::= "{" [0-9]* "}"',
            'root ::= "<tool_call>" [^<]* "</tool_call>"']


class Force:
    # Keeps only the next of `tokens` (its logit raised back where something masked it), then nothing: a plugin
    # that forces text whatever a grammar before it allows.
    def __init__(self, tokens):
        self.tokens, self.at = tokens, 0

    def apply(self, c):
        if self.at < len(self.tokens):
            want = self.tokens[self.at]
            c.logits[c.ids != want] = -np.inf
            c.logits[c.ids == want] = 10.0

    def accept(self, token):
        self.at += 1


class Lift:
    # Raises random tokens (masked or not) above the rest.
    def __init__(self, rng, n):
        self.rng, self.n = rng, n

    def apply(self, c):
        picks = np.array([self.rng.randrange(len(c)) for _ in range(self.n)])
        c.logits[picks] = 50.0 + 10 * np.arange(self.n, dtype=np.float32)


def rendering(text):
    # The template's own rendering of an assistant tool call: its prompt with the call, past the generation prompt.
    try:
        tmpls = ChatTemplates(model, override=text)
        opened = tmpls.apply({"messages": MESSAGES, "tools": [TOOL]})["prompt"]
        done = tmpls.apply({"messages": MESSAGES + [CALL], "tools": [TOOL], "add_generation_prompt": False,
                            "prefill_assistant": False})["prompt"]
    except lp.LlamaError:
        return '<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>'
    n = 0
    while n < min(len(opened), len(done)) and opened[n] == done[n]:
        n += 1
    return done[n:]


def random_chain(rng, forced=None):
    chain = lp.SamplerChain(seed=rng.randrange(2**32))
    steps = ["force"] if forced is not None else []
    steps += rng.sample(["bias", "lift", "top_k", "temp", "force_random"], rng.randrange(0, 4))
    rng.shuffle(steps)
    for step in steps:
        if step == "force":
            chain.add(Force(forced))
        elif step == "force_random":
            chain.add(Force([rng.randrange(n_vocab) for _ in range(rng.randrange(1, 12))]))
        elif step == "bias":
            chain.logit_bias({rng.randrange(n_vocab): rng.choice([-1e9, -50.0, 50.0, 1e9, float("-inf")])
                              for _ in range(rng.randrange(1, 20))} | ({eos: 100.0} if rng.random() < 0.2 else {}))
        elif step == "lift":
            chain.add(Lift(random.Random(rng.randrange(2**32)), rng.randrange(1, 4)))
        elif step == "top_k":
            chain.top_k(rng.randrange(1, 50))
        elif step == "temp":
            chain.temp(rng.choice([0.0, 0.7, 1.5]))
    return chain.greedy() if rng.random() < 0.5 else chain.dist()


def outcome(fn):
    try:
        fn()
        return "ok"
    except lp.LlamaError as exc:
        return type(exc).__name__ + ": " + str(exc)[:300]
    except Exception as exc:  # not a LlamaError: the test fails on it
        return "OTHER " + type(exc).__name__ + ": " + str(exc)[:300]


def consume(out):
    if not isinstance(out, (dict, list, str)) and hasattr(out, "__iter__") and not hasattr(out, "choices"):
        for _ in out:
            pass


def chat_case(path, rng, how):
    text = Path(path).read_text()
    reply = rendering(text)
    tail = rng.choice(["", " and", " and more text", "</tool_call>", "\\n\\nDone."]) if how == "render" else ""
    tokens = model.tokenize(reply + tail, False, rng.random() < 0.5)[:40]
    if how == "random":
        tokens = [rng.randrange(n_vocab) for _ in range(rng.randrange(1, 8))]
    chain = random_chain(rng, tokens)
    choice = rng.choice(["auto", "auto", "required", "none"])
    fn = lambda: consume(llama.create_chat_completion(
        MESSAGES, tools=[TOOL], tool_choice=choice, chat_template=text, sampler=chain, max_tokens=len(tokens) + 4,
        stream=rng.random() < 0.3))
    return outcome(fn)


def grammar_case(rng):
    chain = random_chain(rng, [rng.randrange(n_vocab) for _ in range(rng.randrange(1, 10))])
    grammar = rng.choice(GRAMMARS)
    where = rng.choice(["front", "lazy", "inside"])
    def fn():
        if where == "front":
            c = chain.constrained(grammar)
        elif where == "lazy":
            c = chain.constrained(grammar, trigger_patterns=[rng.choice([r"[\\s\\S]*?(<)[\\s\\S]*", "^\\\\{",
                                                                          "[\\s\\S]*?(the)[\\s\\S]*", "(("])])
        else:  # a grammar inside the chain, with plugins before and after it
            c = lp.SamplerChain(seed=1).add(Lift(random.Random(rng.randrange(99)), 2)).grammar(grammar)
            c = c.add(Force([rng.randrange(n_vocab) for _ in range(6)])).greedy()
        llama.create_completion("The answer is", rng.randrange(1, 12), sampler=c)
    return outcome(fn)


def forced_case(path, tail):
    # QA's repro: a plugin that writes the template's own rendering of a call, then `tail`.
    text = Path(path).read_text()
    chain = lp.SamplerChain().add(Force(model.tokenize(rendering(text) + tail, False, False))).greedy()
    return outcome(lambda: llama.create_chat_completion(MESSAGES, tools=[TOOL], chat_template=text, sampler=chain,
                                                        max_tokens=64))


rng = random.Random(int(seed))
results = {}
if mode == "qa":
    for path in paths:
        for tail in ("", " and"):
            key = Path(path).name + " " + repr(tail)
            print("CASE " + key, flush=True)
            results[key] = forced_case(path, tail)
    paths = []
randoms = set(rng.sample(paths, min(10, len(paths))))  # random tokens: a sample (each case costs ~2 s)
for path in paths:
    for how in ("render", "random") if path in randoms else ("render",):
        key = Path(path).name + " " + how
        print("CASE " + key, flush=True)
        t0 = time.perf_counter()
        results[key] = chat_case(path, rng, how)
        print("TOOK %%.2f" %% (time.perf_counter() - t0), flush=True)
if mode == "grammars":
    for i in range(12):
        key = "grammar %%d" %% i
        print("CASE " + key, flush=True)
        results[key] = grammar_case(rng)
print("RESULT " + json.dumps(results), flush=True)
"""


def run_child(model: Path, seed: int, mode: str, paths: list[Path]) -> dict[str, str]:
    done = run_isolated(CHILD % {"threads": THREADS}, str(model), str(seed), mode, *map(str, paths), timeout=600)
    cases = [line[5:] for line in done.stdout.splitlines() if line.startswith("CASE ")]
    assert done.returncode == 0, (f"the child ended with exit status {done.returncode} in case {cases[-1:]}:\n"
                                  f"{done.stderr[-3000:]}")
    line = next(x for x in reversed(done.stdout.splitlines()) if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_the_repros_that_aborted_end_in_a_reply_or_a_sampling_error(shallow_smollm2_path):
    # On the old helpers the child aborted in the first case: "terminate called after throwing an instance of
    # 'std::runtime_error' what(): Unexpected empty grammar stack after accepting piece: < (44)".
    paths = [p for p in TEMPLATES if p.name in ABORTED]
    assert len(paths) == len(ABORTED)
    results = run_child(shallow_smollm2_path, 0, "qa", paths)
    assert len(results) == 4
    for key, result in results.items():
        assert result == "ok" or result.startswith("SamplingError"), (key, result)
    giga = results["GigaChat3-10B-A1.8B.jinja ''"]
    assert giga.startswith("SamplingError") and "token 44" in giga and "grammar does not allow" in giga


@pytest.mark.slow
def test_random_chains_through_the_library_never_abort(shallow_smollm2_path):
    results = run_child(shallow_smollm2_path, 7, "grammars", TEMPLATES)
    others = {k: v for k, v in results.items() if v.startswith("OTHER")}
    assert not others, others
    assert len(results) == len(TEMPLATES) + 10 + 12  # every template's rendering forced, 10 with random tokens
    # the sweep reached both ends: replies, and sampling failures that used to abort
    assert any(v == "ok" for v in results.values())
    assert any(v.startswith("SamplingError") for v in results.values())


_post = post_status


def _healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
        return resp.status == 200


def _toml_string(text: str) -> str:
    return json.dumps(text)  # JSON's escapes are TOML's basic string escapes


@pytest.mark.slow
def test_random_requests_to_the_server_end_in_a_reply_or_an_api_error(shallow_smollm2_path, tmp_path):
    rng = random.Random(11)
    templates = [p for p in TEMPLATES if p.name in ABORTED] + rng.sample(TEMPLATES, 6)
    table = []
    for i, path in enumerate(templates):  # one model per template: the same GGUF under another name
        (tmp_path / f"t{i}.gguf").symlink_to(shallow_smollm2_path)
        table.append(f'["t{i}.gguf"]\nn_ctx = 2048\nchat_template = {_toml_string(path.read_text())}\n')
    (tmp_path / "models.toml").write_text("\n".join(table))
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    seen: dict[int, int] = {}
    with llamaplug_server(None, "--models-dir", str(tmp_path), "--max-loaded", "2") as (port, proc):
        for i in range(len(templates) * 3):
            body: dict = {"model": f"t{rng.randrange(len(templates))}.gguf", "max_tokens": rng.randrange(1, 24),
                          "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                          "temperature": rng.choice([0.0, 0.8])}
            kinds = rng.sample(["bias", "tools", "grammar", "schema"], rng.randrange(1, 3))
            if "bias" in kinds:
                body["logit_bias"] = {str(rng.randrange(49152)): rng.choice([-100, 100, 1e9, False])
                                      for _ in range(rng.randrange(1, 30))}
            if "tools" in kinds:
                body["tools"] = [tool]
                body["tool_choice"] = rng.choice(["auto", "required"])
            if "grammar" in kinds:
                body["grammar"] = rng.choice(['root ::= "yes" | "no"', 'root ::= [a-z ]+', 'root ::= "<" [a-z]* '])
            elif "schema" in kinds:
                body["response_format"] = {"type": "json_object"}
            status, answer = _post(port, "/v1/chat/completions", body)
            seen[status] = seen.get(status, 0) + 1
            assert status == 200 or (400 <= status < 600 and "error" in answer), (body, status, answer)
            assert proc.poll() is None and _healthy(port), (i, body, status, answer)
    assert seen.get(200)
