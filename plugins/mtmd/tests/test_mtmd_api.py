"""The safe API on the tiny text model + tiny gemma3-type projector (tests/fixtures/tiny_mmproj.py)."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.tiny_mmproj import N_IMAGE_TOKENS, png_bytes, sample_image, sample_tone
from llamaplug_mtmd import (
    DEFAULT_MARKER,
    ChunkType,
    MediaCountError,
    MediaDecodeError,
    MediaTooLargeError,
    MmprojMismatchError,
    MtmdBitmap,
    MtmdContext,
    MtmdInputText,
    MtmdParams,
    UnsupportedMediaError,
    capabilities,
)
from llamaplug_mtmd._lib import ffi, lib
from llamaplug_testing import CHATML, THREADS, greedy

import llamaplug as lp

PROMPT = CHATML.format(DEFAULT_MARKER + "hello world")


def test_default_marker_is_the_pins():
    assert ffi.string(lib.mtmd_default_marker()).decode() == DEFAULT_MARKER


def test_capabilities(tiny, mtmd_files):
    _, _, mtmd = tiny
    assert mtmd.support_vision() and not mtmd.support_audio()
    assert mtmd.audio_sample_rate is None
    assert capabilities(mtmd_files["mmproj"]) == (True, False)


@pytest.mark.parametrize("shape", [(24, 40), (32, 32), (7, 300), (200, 5)])
def test_chunks_for_an_image(tiny, shape):
    """Text, image, text; the gemma3 projector resizes any image to 32x32: 4 tokens, whatever the size."""
    _, _, mtmd = tiny
    image = MtmdBitmap.from_array(sample_image(*shape))
    chunks = mtmd.tokenize(PROMPT, [image])
    assert [c.type for c in chunks] == [ChunkType.TEXT, ChunkType.IMAGE, ChunkType.TEXT]
    media = chunks[1]
    assert media.n_tokens == media.n_pos == N_IMAGE_TOKENS
    assert media.id == image.id and media.tokens.size == 0
    assert chunks.n_tokens == sum(c.n_tokens for c in chunks)
    assert chunks.n_tokens == chunks[0].n_tokens + N_IMAGE_TOKENS + chunks[2].n_tokens
    assert chunks[0].tokens.size == chunks[0].n_tokens


def test_two_images_and_text_only(tiny):
    _, _, mtmd = tiny
    a, b = MtmdBitmap.from_array(sample_image(seed=1)), MtmdBitmap.from_array(sample_image(seed=2))
    chunks = mtmd.tokenize(f"a {DEFAULT_MARKER} b {DEFAULT_MARKER} c", [a, b])
    assert [c.type for c in chunks].count(ChunkType.IMAGE) == 2
    assert [c.id for c in chunks if c.type == ChunkType.IMAGE] == [a.id, b.id]
    text_only = mtmd.tokenize(MtmdInputText("hello world", add_special=False, parse_special=True))
    assert [c.type for c in text_only] == [ChunkType.TEXT]
    assert text_only[0].tokens.tolist() == tiny[0].tokenize("hello world", add_bos=False)


def test_n_past_advances_by_the_image_tokens(tiny):
    model, ctx, mtmd = tiny
    ctx.clear_cache()
    with_image = mtmd.tokenize(PROMPT, [MtmdBitmap.from_array(sample_image())])
    n_past = with_image.eval(ctx, 0)
    assert n_past == with_image.n_pos == ctx.n_past
    assert ctx.kv_cache_seq_pos_max(0) == n_past - 1
    ctx.clear_cache()
    text_only = mtmd.tokenize(PROMPT.replace(DEFAULT_MARKER, ""))
    n_text = text_only.eval(ctx, 0)
    image_text = [c for c in with_image if c.type == ChunkType.TEXT]
    # the image adds its 4 tokens (and the <start_of_image>/<end_of_image> text gemma3 wraps it in)
    assert n_past - n_text == N_IMAGE_TOKENS + sum(c.n_tokens for c in image_text) - text_only.n_tokens
    assert n_past - n_text >= N_IMAGE_TOKENS
    # evaluation goes on from n_past: a second image after the first
    more = mtmd.tokenize(DEFAULT_MARKER, [MtmdBitmap.from_array(sample_image(seed=3))], add_special=False)
    assert more.eval(ctx, n_text) == n_text + more.n_pos


def test_same_image_twice_same_embeddings(tiny):
    _, _, mtmd = tiny
    embd = []
    for seed in (5, 5, 6):
        chunks = mtmd.tokenize(DEFAULT_MARKER, [MtmdBitmap.from_array(sample_image(seed=seed))], add_special=False)
        embd.append(mtmd.encode_chunk(chunks[0] if chunks[0].type == ChunkType.IMAGE else chunks[1]))
    assert embd[0].shape == (N_IMAGE_TOKENS, 32) and np.isfinite(embd[0]).all()
    assert np.array_equal(embd[0], embd[1])
    assert not np.array_equal(embd[0], embd[2])


def test_bitmaps_from_file_bytes_and_numpy_agree(tiny, mtmd_files):
    model, ctx, mtmd = tiny
    pixels = sample_image()
    sources = {
        "png file": MtmdBitmap.from_file(mtmd_files["png"]),
        "png bytes": MtmdBitmap.from_bytes(mtmd_files["png"].read_bytes()),
        "bmp file": MtmdBitmap.from_file(mtmd_files["bmp"]),
        "numpy": MtmdBitmap.from_array(pixels),
        "strided numpy": MtmdBitmap.from_array(np.asfortranarray(pixels)),
    }
    for name, bitmap in sources.items():
        assert (bitmap.nx, bitmap.ny, bitmap.is_audio) == (40, 24, False), name
        assert np.array_equal(bitmap.data, pixels), name
    # the id is the sha256 of what was given: the file's bytes, or the pixels
    assert sources["png file"].id == sources["png bytes"].id != sources["numpy"].id
    outputs = {}
    for name, bitmap in sources.items():
        ctx.clear_cache()
        chunks = mtmd.tokenize(PROMPT, [bitmap])
        image = next(c for c in chunks if c.type == ChunkType.IMAGE)
        embd = mtmd.encode_chunk(image)
        chunks.eval(ctx, 0)
        outputs[name] = (embd, greedy(model, ctx, 8))
    first = next(iter(outputs.values()))
    for name, (embd, tokens) in outputs.items():
        assert np.array_equal(embd, first[0]), name
        assert tokens == first[1], name


def test_generation_depends_on_the_image(tiny):
    """Different pixels, different embeddings in the KV cache: the next-token logits differ."""
    model, ctx, mtmd = tiny
    logits = []
    for seed in (1, 2):
        ctx.clear_cache()
        mtmd.tokenize(PROMPT, [MtmdBitmap.from_array(sample_image(seed=seed))]).eval(ctx, 0)
        logits.append(ctx.get_logits_ith(-1).copy())
    assert not np.allclose(logits[0], logits[1])


# -- bad input -----------------------------------------------------------------

def test_unreadable_and_corrupt_images(tiny, tmp_path):
    _, _, mtmd = tiny
    with pytest.raises(MediaDecodeError, match="cannot read media file"):
        MtmdBitmap.from_file(tmp_path / "missing.png")
    good = png_bytes(sample_image())
    for bad in (b"", b"not an image at all", good[:40], good[:8] + b"\x00" * 60):
        with pytest.raises(MediaDecodeError):
            MtmdBitmap.from_bytes(bad)
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 100)
    with pytest.raises(MediaDecodeError, match="bad.jpg"):
        MtmdBitmap.from_file(tmp_path / "bad.jpg", mtmd)
    with pytest.raises(lp.InvalidParameterError, match="uint8"):
        MtmdBitmap.from_array(np.zeros((4, 4, 3), dtype=np.float32))
    with pytest.raises(lp.InvalidParameterError, match=r"\(height, width, 3\)"):
        MtmdBitmap.from_array(np.zeros((4, 4), dtype=np.uint8))
    with pytest.raises(MediaDecodeError, match="0x4"):
        MtmdBitmap.from_array(np.zeros((4, 0, 3), dtype=np.uint8))


def test_audio_without_an_audio_encoder(tiny):
    from fixtures.tiny_mmproj import wav_bytes

    _, _, mtmd = tiny
    wav = wav_bytes(sample_tone())
    with pytest.raises(UnsupportedMediaError, match="needs the MtmdContext"):
        MtmdBitmap.from_bytes(wav)
    with pytest.raises(UnsupportedMediaError, match="no audio encoder"):
        MtmdBitmap.from_bytes(wav, mtmd)
    clip = MtmdBitmap.from_audio(sample_tone())
    assert clip.is_audio and clip.data.size == sample_tone().size
    with pytest.raises(UnsupportedMediaError, match="no audio encoder"):
        mtmd.tokenize(DEFAULT_MARKER, [clip])
    with pytest.raises(MediaDecodeError, match="NaN"):
        MtmdBitmap.from_audio(np.array([0.0, np.nan], dtype=np.float32))


def test_markers_and_media_must_pair(tiny):
    _, _, mtmd = tiny
    image = MtmdBitmap.from_array(sample_image())
    with pytest.raises(MediaCountError, match="1 media marker.*2 bitmap") as more_media:
        mtmd.tokenize(PROMPT, [image, image])
    assert (more_media.value.n_markers, more_media.value.n_media) == (1, 2)
    with pytest.raises(MediaCountError, match="2 media marker.*1 bitmap"):
        mtmd.tokenize(PROMPT + DEFAULT_MARKER, [image])
    with pytest.raises(MediaCountError, match="1 media marker.*0 bitmap"):
        mtmd.tokenize(PROMPT)


def test_mmproj_that_does_not_fit_the_text_model(tiny, mtmd_files, tmp_path):
    model = tiny[0]
    with pytest.raises(MmprojMismatchError, match=r"n_embd = 32.*n_embd = 48"):
        MtmdContext(mtmd_files["mmproj_48"], model, MtmdParams(n_threads=THREADS, warmup=False))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(mtmd_files["mmproj"].read_bytes()[:5000])
    with pytest.raises(lp.InvalidModelError, match="multimodal projector"):
        MtmdContext(truncated, model, MtmdParams(n_threads=THREADS, warmup=False))
    with pytest.raises(lp.ModelNotFoundError):
        MtmdContext(tmp_path / "none.gguf", model)
    with pytest.raises(lp.InvalidModelError):
        MtmdContext(mtmd_files["text"], model, MtmdParams(warmup=False))  # a text model is no projector


def test_image_larger_than_the_context(tiny, mtmd_files):
    model, ctx, mtmd = tiny
    chunks = mtmd.tokenize(PROMPT, [MtmdBitmap.from_array(sample_image())])
    with pytest.raises(MediaTooLargeError, match=r"n_ctx=256.*image.*4 positions"):
        chunks.eval(ctx, ctx.n_ctx - 10)
    assert isinstance(MediaTooLargeError("x"), lp.ContextOverflowError)
    # gemma3 attends to an image's tokens together: they must fit in one micro-batch
    small = lp.LlamaContext(model, lp.ContextParams(n_ctx=256, n_batch=2, n_ubatch=2, n_threads=THREADS))
    with pytest.raises(MediaTooLargeError, match="n_ubatch to at least 4"):
        chunks.eval(small, 0)
    small.close()


def test_eval_arguments_are_checked(tiny):
    model, ctx, mtmd = tiny
    chunks = mtmd.tokenize(PROMPT, [MtmdBitmap.from_array(sample_image())])
    with pytest.raises(lp.InvalidParameterError, match="n_past"):
        chunks.eval(ctx, -1)
    with pytest.raises(lp.InvalidParameterError, match="seq_id"):
        chunks.eval(ctx, 0, seq_id=5)
    with pytest.raises(lp.InvalidParameterError, match="n_batch"):
        chunks.eval(ctx, 0, n_batch=0)
    with pytest.raises(lp.InvalidParameterError, match="LlamaContext"):
        chunks.eval(object(), 0)


def test_lifetimes(mtmd_files):
    model = lp.LlamaModel(mtmd_files["text"], lp.ModelParams())
    ctx = lp.LlamaContext(model, lp.ContextParams(n_ctx=256, n_threads=THREADS))
    with MtmdContext(mtmd_files["mmproj"], model, MtmdParams(n_threads=THREADS, warmup=False)) as mtmd:
        chunks = mtmd.tokenize(PROMPT, [MtmdBitmap.from_array(sample_image())])
    assert mtmd.closed
    with pytest.raises(lp.ClosedError):
        chunks.eval(ctx, 0)
    mtmd = MtmdContext(mtmd_files["mmproj"], model, MtmdParams(n_threads=THREADS, warmup=False))
    chunks = mtmd.tokenize(PROMPT, [MtmdBitmap.from_array(sample_image())])
    model.close()  # closes its contexts first, the multimodal one included
    assert mtmd.closed and ctx.closed
    with pytest.raises(lp.ClosedError):
        mtmd.support_vision()
    assert len(chunks) == 3  # chunks own their data: still readable
    chunks.close()
    chunks.close()
    with pytest.raises(lp.ClosedError):
        len(chunks)
