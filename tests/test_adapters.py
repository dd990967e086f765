"""LoRA adapters and control vectors: the same greedy text as the native llama-completion given the same files."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.adapters import control_vector, write_control_vector, write_lora
from llamaplug_testing import THREADS, llama_completion

import llamaplug as lp

PROMPT = "The capital of France is"
N = 24


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {"lora": write_lora(root / "lora.gguf"), "cvec": write_control_vector(root / "cvec.gguf", control_vector()),
            "wrong_arch": write_lora(root / "gemma.gguf", arch="gemma3"),
            "wrong_shape": write_lora(root / "narrow.gguf", n_embd=100), "root": root}


def native(bin_dir, model, *extra: str) -> str:
    return llama_completion(bin_dir, model, PROMPT, N, "--temp", "0", *extra)


def assert_same(ours: str, theirs: str) -> None:
    assert theirs.startswith(ours) and theirs[len(ours):].strip() == "", f"native: {theirs!r}\nours:   {ours!r}"


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_lora_matches_native(llama, native_tools, smollm2_path, files, scale):
    adapter = lp.LoraAdapter.load(llama.model, files["lora"])
    try:
        llama.context.set_lora(adapter, scale)
        ours = llama.create_completion(PROMPT, N).text
    finally:
        llama.context.clear_loras()
        adapter.close()
    assert_same(ours, native(native_tools, smollm2_path, "--lora-scaled", f"{files['lora']}:{scale}"))
    assert ours != llama.create_completion(PROMPT, N).text  # the adapter did change the text


def test_scale_changes_and_removal_without_reloading(llama, files):
    base = llama.create_completion(PROMPT, N).tokens
    adapter = lp.LoraAdapter.load(llama.model, files["lora"])
    try:
        llama.context.set_lora(adapter, 1.0)
        full = llama.create_completion(PROMPT, N).tokens
        llama.context.set_lora(adapter, 0.0)
        assert llama.create_completion(PROMPT, N).tokens == base
        llama.context.set_lora(adapter, 1.0)
        assert llama.create_completion(PROMPT, N).tokens == full != base
        llama.context.remove_lora(adapter)
        assert llama.create_completion(PROMPT, N).tokens == base and llama.context.loras == {}
        with pytest.raises(lp.InvalidParameterError, match="not applied"):
            llama.context.remove_lora(adapter)
    finally:
        adapter.close()


def test_two_adapters_at_once(llama, files):
    a = lp.LoraAdapter.load(llama.model, files["lora"])
    b = lp.LoraAdapter.load(llama.model, write_lora(files["root"] / "other.gguf", seed=9))
    try:
        llama.context.set_lora(a, 1.0)
        one = llama.create_completion(PROMPT, N).tokens
        llama.context.set_lora(b, 1.0)
        assert set(llama.context.loras) == {a, b}
        assert llama.create_completion(PROMPT, N).tokens != one
    finally:
        llama.context.clear_loras()
        a.close()
        b.close()


def test_llama_params_lora(smollm2_path, files, llama):
    with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=512, n_threads=THREADS,
                                      lora=[(files["lora"], 1.0)])) as adapted:
        assert list(adapted.context.loras.values()) == [1.0]
        with_file = adapted.create_completion(PROMPT, N).tokens
    adapter = lp.LoraAdapter.load(llama.model, files["lora"])
    try:
        llama.context.set_lora(adapter, 1.0)
        assert llama.create_completion(PROMPT, N).tokens == with_file
    finally:
        llama.context.clear_loras()
        adapter.close()


@pytest.mark.parametrize("name,fragment", [("wrong_arch", "gemma3"), ("wrong_shape", "shape")])
def test_a_mismatched_adapter_is_an_error(llama, files, name, fragment):
    with pytest.raises(lp.InvalidModelError) as err:
        lp.LoraAdapter.load(llama.model, files[name])
    assert str(files[name]) in str(err.value) and fragment in str(err.value).lower()


def test_missing_adapter_file(llama, tmp_path):
    with pytest.raises(lp.ModelNotFoundError):
        lp.LoraAdapter.load(llama.model, tmp_path / "none.gguf")


def test_control_vector_matches_native(llama, native_tools, smollm2_path, files):
    llama.context.apply_control_vector(lp.ControlVector.load(files["cvec"]))
    try:
        ours = llama.create_completion(PROMPT, N).text
    finally:
        llama.context.apply_control_vector(None)
    assert_same(ours, native(native_tools, smollm2_path, "--control-vector", str(files["cvec"])))
    assert ours != llama.create_completion(PROMPT, N).text


def test_control_vector_from_an_array_and_a_layer_range(llama):
    base = llama.create_completion(PROMPT, N).tokens
    data = control_vector()
    llama.context.apply_control_vector(np.zeros_like(data))
    assert llama.create_completion(PROMPT, N).tokens == base  # zero directions change nothing
    llama.context.apply_control_vector(data, 10, 20)
    assert llama.create_completion(PROMPT, N).tokens != base
    llama.context.apply_control_vector(None)
    assert llama.create_completion(PROMPT, N).tokens == base
    with pytest.raises(lp.InvalidParameterError, match="n_embd"):
        llama.context.apply_control_vector(np.ones((30, 10)))
    with pytest.raises(lp.InvalidParameterError, match="outside"):
        llama.context.apply_control_vector(data, 5, 40)
