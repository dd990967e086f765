"""Parameters: llama.cpp's tool defaults, validation errors naming the field, builders."""

import pytest

import llamaplug as lp


def test_defaults_follow_llama_cpp_common_params():
    p = lp.ContextParams()
    assert (p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max) == (0, 2048, 512, 1)
    assert p.flash_attn_type == lp.FlashAttnType.AUTO
    assert (p.type_k, p.type_v) == (lp.KvCacheType.F16, lp.KvCacheType.F16)
    assert p.n_threads >= 1 and not p.swa_full and p.offload_kqv


def test_enum_values_match_native_headers():
    from llamaplug.raw import lib

    assert lp.FlashAttnType.AUTO == lib.LLAMA_FLASH_ATTN_TYPE_AUTO
    assert lp.SplitMode.ROW == lib.LLAMA_SPLIT_MODE_ROW
    assert lp.PoolingType.RANK == lib.LLAMA_POOLING_TYPE_RANK
    assert lp.NumaStrategy.NUMACTL == lib.GGML_NUMA_STRATEGY_NUMACTL
    for kv in lp.KvCacheType:
        assert kv.value == getattr(lib, f"GGML_TYPE_{kv.name}")


def test_seed_003_constants_reachable():
    from llamaplug import raw

    assert raw.LLAMA_DEFAULT_SEED == 0xFFFFFFFF and raw.LLAMA_TOKEN_NULL == -1
    assert raw.LLAMA_SESSION_MAGIC == raw.LLAMA_FILE_MAGIC_GGSN == 0x6767736E
    assert raw.LLAMA_VOCAB_TYPE_BPE == 2 and raw.GGML_TYPE_Q4_1 == 3
    assert callable(raw.llama_backend_init) and callable(raw.llama_model_load_from_file)


@pytest.mark.parametrize("field,value", [("n_ctx", -1), ("n_batch", 0), ("type_k", "q9_9"), ("flash_attn_type", 7)])
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(lp.InvalidParameterError) as err:
        lp.LlamaParams(model_path="m.gguf", **{field: value})
    assert err.value.field == field and field in str(err.value)


def test_builders_return_validated_copies():
    p = lp.LlamaParams("m.gguf")
    q = p.with_n_ctx(4096).with_flash_attn_type("off").with_type_k("q8_0")
    assert (q.n_ctx, q.flash_attn_type, q.type_k) == (4096, lp.FlashAttnType.DISABLED, lp.KvCacheType.Q8_0)
    assert p.n_ctx == 0  # the original is unchanged
    with pytest.raises(lp.InvalidParameterError):
        p.with_n_ubatch(-3)


def test_mmap_mlock_map_to_load_mode():
    from llamaplug.raw import lib

    assert lp.ModelParams().load_mode == lib.LLAMA_LOAD_MODE_AUTO
    assert lp.ModelParams(use_mmap=False).load_mode == lib.LLAMA_LOAD_MODE_NONE
    assert lp.ModelParams(use_mmap=True, use_mlock=True).load_mode == lib.LLAMA_LOAD_MODE_MMAP_MLOCK
    assert lp.ModelParams(use_mmap=False, use_mlock=True).load_mode == lib.LLAMA_LOAD_MODE_MLOCK


def test_static_bounds_are_llama_cpps_own():
    from llamaplug import params, raw

    assert params.LLAMA_MAX_SEQ == raw.llama_max_parallel_sequences()


def test_n_gpu_layers_words_are_read_in_one_place():
    from llamaplug import ModelParams

    assert [ModelParams(n_gpu_layers=v).gpu_layers for v in ("auto", "all", -1, 0, 12, "12")] == [-1, -1, -1, 0, 12, 12]
    assert ModelParams().fit_layers and not ModelParams(n_gpu_layers="all").fit_layers
    assert not ModelParams(vocab_only=True).fit_layers
