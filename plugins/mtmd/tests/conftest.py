"""The plugin's fixtures: the tiny text model and tiny projector (tests/fixtures), written once per session."""

from __future__ import annotations

from pathlib import Path

import llamaplug_mtmd._cffi  # noqa: F401 - a plugin that failed to build fails here, never skips
import pytest
from llamaplug_testing import THREADS


@pytest.fixture(scope="session")
def mtmd_files(tmp_path_factory) -> dict[str, Path]:
    from fixtures.tiny_gguf import write_tiny_model
    from fixtures.tiny_mmproj import (
        bmp_bytes,
        png_bytes,
        sample_image,
        sample_tone,
        wav_bytes,
        write_tiny_audio_mmproj,
        write_tiny_mmproj,
    )

    root = tmp_path_factory.mktemp("mtmd")
    image = sample_image()
    files = {
        "text": write_tiny_model(root / "text.gguf"),
        "mmproj": write_tiny_mmproj(root / "mmproj.gguf"),
        "mmproj_48": write_tiny_mmproj(root / "mmproj-48.gguf", out_embd=48),
        "mmproj_audio": write_tiny_audio_mmproj(root / "mmproj-audio.gguf"),
        "wav": root / "tone.wav",
        "png": root / "image.png",
        "bmp": root / "image.bmp",
    }
    files["png"].write_bytes(png_bytes(image))
    files["bmp"].write_bytes(bmp_bytes(image))
    files["wav"].write_bytes(wav_bytes(sample_tone(1.0)))
    return files


@pytest.fixture(scope="module")
def tiny(mtmd_files):
    """(model, llama context, mtmd context) on the tiny pair."""
    yield from _opened(mtmd_files, "mmproj", 256)


@pytest.fixture(scope="module")
def audio(mtmd_files):
    """The same with the audio projector (an audio window is 750 tokens)."""
    yield from _opened(mtmd_files, "mmproj_audio", 1024)


def _opened(files: dict[str, Path], projector: str, n_ctx: int):
    from llamaplug_mtmd import MtmdContext, MtmdParams

    import llamaplug as lp

    lp.LlamaBackend.init()
    model = lp.LlamaModel(files["text"], lp.ModelParams())
    ctx = lp.LlamaContext(model, lp.ContextParams(n_ctx=n_ctx, n_threads=THREADS))
    mtmd = MtmdContext(files[projector], model, MtmdParams(n_threads=THREADS, warmup=False))
    yield model, ctx, mtmd
    model.close()
