"""Audio through the tiny qwen2a-type projector (tests/fixtures/tiny_mmproj.py): WAV and PCM agree, chunks, n_past."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.tiny_mmproj import N_AUDIO_TOKENS, sample_image, sample_tone, wav_bytes
from llamaplug_mtmd import (
    DEFAULT_MARKER,
    ChunkType,
    MediaDecodeError,
    MtmdBitmap,
    UnsupportedMediaError,
    capabilities,
)
from llamaplug_testing import CHATML, greedy


def test_audio_capabilities(audio, mtmd_files):
    _, _, mtmd = audio
    assert mtmd.support_audio() and not mtmd.support_vision()
    assert mtmd.audio_sample_rate == 16000
    assert capabilities(mtmd_files["mmproj_audio"]) == (False, True)


def test_wav_file_bytes_and_pcm_agree(audio, mtmd_files):
    """A 16 kHz 16-bit WAV decodes to its samples (to 16-bit precision); all three give the same tokens."""
    model, ctx, mtmd = audio
    tone = sample_tone(1.0)
    pcm16 = (np.clip(tone, -1, 1) * 32767).astype("<i2") / np.float32(32768)  # the WAV's samples, as read back
    bitmaps = {"file": MtmdBitmap.from_file(mtmd_files["wav"], mtmd),
               "bytes": MtmdBitmap.from_bytes(mtmd_files["wav"].read_bytes(), mtmd),
               "pcm": MtmdBitmap.from_audio(pcm16)}
    for name, bitmap in bitmaps.items():
        assert bitmap.is_audio, name
        assert np.allclose(bitmap.data, pcm16, atol=1e-4), name
    outputs = {}
    for name, bitmap in bitmaps.items():
        ctx.clear_cache()
        chunks = mtmd.tokenize(CHATML.format(DEFAULT_MARKER + "hello"), [bitmap])
        assert [c.type for c in chunks] == [ChunkType.TEXT, ChunkType.AUDIO, ChunkType.TEXT]
        assert chunks[1].n_tokens == N_AUDIO_TOKENS  # one 30 s window: 3000 mel frames / 2 (conv) / 2 (pool)
        embd = mtmd.encode_chunk(chunks[1])
        n_past = chunks.eval(ctx, 0)
        assert n_past == chunks.n_pos == ctx.kv_cache_seq_pos_max(0) + 1
        outputs[name] = (embd, greedy(model, ctx, 8))
    first = outputs["file"]
    for name, (embd, tokens) in outputs.items():
        assert np.allclose(embd, first[0], atol=1e-4), name
        assert tokens == first[1], name


def test_longer_audio_takes_more_windows(audio):
    _, _, mtmd = audio
    clip = MtmdBitmap.from_audio(sample_tone(31.0))
    chunks = mtmd.tokenize(DEFAULT_MARKER, [clip], add_special=False)
    media = [c for c in chunks if c.type == ChunkType.AUDIO]
    assert sum(c.n_tokens for c in media) == 2 * N_AUDIO_TOKENS


def test_audio_bad_input(audio, mtmd_files):
    _, _, mtmd = audio
    wav = wav_bytes(sample_tone(0.2))
    with pytest.raises(MediaDecodeError, match="not a readable audio"):
        MtmdBitmap.from_bytes(wav[:20], mtmd)
    with pytest.raises(UnsupportedMediaError, match="no vision encoder"):
        mtmd.tokenize(DEFAULT_MARKER, [MtmdBitmap.from_array(sample_image())])


def test_chat_parts_load_with_their_kind(audio, mtmd_files):
    import base64

    from llamaplug_mtmd import prepare_messages

    _, _, mtmd = audio
    wav = base64.b64encode(mtmd_files["wav"].read_bytes()).decode()
    flat, bitmaps = prepare_messages([{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}, {"type": "text", "text": "hi"}]}], mtmd)
    assert flat[0]["content"] == DEFAULT_MARKER + "hi" and [b.is_audio for b in bitmaps] == [True]
    with pytest.raises(MediaDecodeError, match=r"messages\[0\].content\[0\]: an image part whose data is audio"):
        prepare_messages([{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + wav}}]}], mtmd)
