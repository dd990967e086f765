"""Code written for llama-cpp-python beyond LangChain, unchanged on llamaplug.compat, compared with llama-cpp-python.

Each framework's quick-start example (tests/fixtures/llama_cpp_frameworks.py: LlamaIndex's LlamaCPP, outlines'
llama.cpp model, instructor's patched create_chat_completion_openai_v1) runs greedily on SmolLM2 twice, in one
child process per side: on llama-cpp-python 0.3.36 itself (installed without its own llama.cpp build,
LLAMA_BUILD=OFF, see tox.ini) over the pin's libllama from the native tools (the same llama.cpp commit its sdist
ships; our patches do not touch libllama, and the one to ggml's backend search only acts where the core defines
GGML_BACKEND_NO_DEFAULT_SEARCH), and on llamaplug.compat after install_as_llama_cpp(). Each example's results
must be equal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llamaplug_testing.llama_cpp_reference import REFERENCE, run_both

# Two children that import LlamaIndex, outlines (numba compiles its kernels) and instructor and load SmolLM2 four
# times each: about 110 s of CPU in all, over 30 s on the CI's two cores.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "fixtures" / "llama_cpp_frameworks.py"


@pytest.fixture(scope="module")
def runs(native_tools, smollm2_path) -> dict[str, dict]:
    """Both sides' results (llamaplug_testing/llama_cpp_reference.py runs the two children at once)."""
    out = {side: json.loads(stdout) for side, stdout in run_both(SCRIPT, smollm2_path, native_tools).items()}
    assert out["reference"]["llama_cpp"] == REFERENCE and "+llamaplug" in out["compat"]["llama_cpp"]
    return out


def results(runs, name):
    ref, ours = runs["reference"][name], runs["compat"][name]
    for side, got in (("reference", ref), ("compat", ours)):
        assert "error" not in got, f"{name} on {side}: {got.get('trace')}"
    return ref, ours


def test_llamaindex_llamacpp_complete_stream_and_chat(runs):
    ref, ours = results(runs, "llamaindex")
    assert ref["complete"].strip() and ref["complete"] == ref["stream_complete"]
    assert ours == ref


def test_outlines_llamacpp_text_and_choice(runs):
    ref, ours = results(runs, "outlines")
    assert ref["text"].strip()
    assert ours == ref


def test_instructor_patched_create_chat_completion_openai_v1(runs):
    ref, ours = results(runs, "instructor")
    # JSON mode (json_object, the schema in the system message): the same reply on both (SmolLM2 answers with the
    # schema itself, which instructor rejects on both), but for what follows the JSON: llama-cpp-python's
    # json_object grammar allows whitespace after the closing brace (SmolLM2 adds one newline there), llamaplug's
    # ends at the brace.
    assert ref["JSON"]["content"] and ours["JSON"]["error"] == ref["JSON"]["error"]
    assert ref["JSON"]["content"] == ours["JSON"]["content"] + "\n"
    # JSON_SCHEMA mode (response_format type json_schema, OpenAI's): llama-cpp-python 0.3.36 takes json_object
    # only and ignores it, replying free text that instructor cannot parse; llamaplug.compat keeps OpenAI's
    # meaning and constrains the reply to the schema (docs/from-llama-cpp-python.md names the difference).
    assert ref["JSON_SCHEMA"]["error"] == "InstructorRetryException"
    assert not ref["JSON_SCHEMA"]["content"].lstrip().startswith("{")
    assert set(ours["JSON_SCHEMA"]) == {"name", "colour"}
