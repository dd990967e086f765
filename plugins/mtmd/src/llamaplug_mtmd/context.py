"""The safe multimodal building blocks: MtmdContext, MtmdBitmap, MtmdInputText, MtmdInputChunks.

Seed 001's flow: an `MtmdBitmap` (image or audio) and an `MtmdInputText` whose media markers
say where each bitmap goes are tokenised by an `MtmdContext` into chunks (text tokens, image or
audio tokens); `chunks.eval(llama_context, n_past)` encodes the media with the projector and
extends the context's KV cache, after which sampling is the text model's, as usual.

Lifetimes are the core's: `close()` / `with` / `ffi.gc`; an `MtmdContext` is a dependent of its
`LlamaModel` (closing the model closes it first); chunks and bitmaps own their native objects.
"""

from __future__ import annotations

import enum
import hashlib
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from llamaplug import ClosedError, DecodeError, InvalidParameterError, LlamaContext, LlamaModel, ModelNotFoundError
from llamaplug.params import Params
from llamaplug.plugin_api import NativeHandle, capture_errors, native_error

from ._lib import ffi, lib, route_log
from .errors import (
    InvalidMmprojError,
    MediaCountError,
    MediaDecodeError,
    MediaTooLargeError,
    MmprojMismatchError,
    UnsupportedMediaError,
)

DEFAULT_MARKER = "<__media__>"  # mtmd_default_marker() of the pin (checked in the tests)


class ChunkType(enum.IntEnum):
    TEXT = 0
    IMAGE = 1
    AUDIO = 2


class MtmdParams(Params):
    """mtmd_context_params: where and how the projector runs."""

    use_gpu: bool = Field(True, description="run the projector on the GPU backend the core loaded, if any")
    n_threads: int = Field(0, ge=0, le=1024, description="CPU threads for the projector; 0 = physical cores")
    print_timings: bool = False
    media_marker: str = Field(DEFAULT_MARKER, min_length=1, description="where a bitmap goes in the text")
    warmup: bool = Field(True, description="run one encode at load (catches an unusable projector early)")
    image_min_tokens: int = Field(-1, ge=-1, description="-1: the mmproj's own value")
    image_max_tokens: int = Field(-1, ge=-1, description="-1: the mmproj's own value")


def _default_threads() -> int:
    from llamaplug.params import ContextParams

    return int(ContextParams().n_threads or os.cpu_count() or 1)


def is_audio_bytes(data: bytes) -> bool:
    """mtmd-helper's test (WAV, MP3, FLAC by their first bytes), so that audio is routed as it routes it."""
    if len(data) < 12:
        return False
    return ((data[:4] == b"RIFF" and data[8:12] == b"WAVE") or data[:3] == b"ID3" or data[:4] == b"fLaC"
            or (data[0] == 0xFF and (data[1] & 0xE0) == 0xE0))


class MtmdContext(NativeHandle):
    """A projector (mmproj GGUF) paired with a loaded text model.

    Its native calls that use the projector's state (tokenize, encode, eval) take `lock` one at a time: a server
    evaluates a chat's media on its engine thread and an embedding request's on a worker thread, with the same
    projector, whose encoder keeps its output in the context.
    """

    _what = "multimodal context"

    def __init__(self, mmproj_path: str | os.PathLike[str], model: LlamaModel, params: MtmdParams | None = None):
        self.params = params = params or MtmdParams()
        self.lock = threading.RLock()
        path = Path(mmproj_path)
        if not path.is_file():
            raise ModelNotFoundError(f"mmproj file not found: {path}")
        route_log()
        c = lib.mtmd_context_params_default()
        c.use_gpu = params.use_gpu
        c.print_timings = params.print_timings
        c.n_threads = params.n_threads or _default_threads()
        self._marker = params.media_marker.encode()
        c.media_marker = self._marker_c = ffi.new("char[]", self._marker)
        c.warmup = params.warmup
        c.image_min_tokens = params.image_min_tokens
        c.image_max_tokens = params.image_max_tokens
        with capture_errors() as errors:
            ptr = lib.mtmd_init_from_file(os.fsencode(path), model.raw_handle(), c)
        if ptr == ffi.NULL:
            mismatch = [line for line in errors if "mismatch between text model" in line]
            if mismatch:
                raise native_error(MmprojMismatchError, f"{path.name} does not fit {model.path.name}", mismatch[-1:],
                                   "use the mmproj made for this model")
            raise native_error(InvalidMmprojError, f"could not load {path} as a multimodal projector", errors)
        self._adopt(ptr, lib.mtmd_free)
        model.add_dependent(self)
        self.model = model
        self.path = path

    def raw_handle(self) -> Any:
        """The `mtmd_context *` for the raw layer (valid while this context is open)."""
        return self._ptr

    # -- what the projector can do -------------------------------------------
    def support_vision(self) -> bool:
        return bool(lib.mtmd_support_vision(self._ptr))

    def support_audio(self) -> bool:
        return bool(lib.mtmd_support_audio(self._ptr))

    @property
    def audio_sample_rate(self) -> int | None:
        """Hz that audio bitmaps are taken in (None without an audio encoder)."""
        rate = int(lib.mtmd_get_audio_sample_rate(self._ptr))
        return rate if rate > 0 else None

    @property
    def marker(self) -> str:
        return self._marker.decode()

    @property
    def uses_mrope(self) -> bool:
        return bool(lib.mtmd_decode_use_mrope(self._ptr))

    # -- tokenise ------------------------------------------------------------
    def tokenize(self, text: str | MtmdInputText, bitmaps: Sequence[MtmdBitmap] = (), *, add_special: bool = True,
                 parse_special: bool = True) -> MtmdInputChunks:
        """Text with one marker per bitmap (in order) -> chunks of text tokens and media tokens."""
        if not isinstance(text, MtmdInputText):
            text = MtmdInputText(text, add_special=add_special, parse_special=parse_special)
        bitmaps = list(bitmaps)
        for i, bitmap in enumerate(bitmaps):
            if not isinstance(bitmap, MtmdBitmap):
                raise InvalidParameterError(f"bitmaps[{i}] is a {type(bitmap).__name__}, not an MtmdBitmap",
                                            field="bitmaps")
            if bitmap.is_audio and not self.support_audio():
                raise UnsupportedMediaError(f"bitmaps[{i}] is audio, and {self.path.name} has no audio encoder")
            if not bitmap.is_audio and not self.support_vision():
                raise UnsupportedMediaError(f"bitmaps[{i}] is an image, and {self.path.name} has no vision encoder")
        n_markers = text.text.count(self.marker)
        if n_markers != len(bitmaps):
            raise MediaCountError(f"the text has {n_markers} media marker(s) {self.marker!r} and {len(bitmaps)} "
                                  "bitmap(s) were given: one marker per bitmap, in order", n_markers, len(bitmaps))
        encoded = text.text.encode()
        c_text = ffi.new("mtmd_input_text *")
        keep = ffi.new("char[]", encoded)
        c_text.text, c_text.text_len = keep, len(encoded)
        c_text.add_special, c_text.parse_special = text.add_special, text.parse_special
        c_bitmaps = ffi.new("mtmd_bitmap *[]", [b.raw_handle() for b in bitmaps] or 1)
        out = lib.mtmd_input_chunks_init()
        chunks = MtmdInputChunks(out, self)
        with self.lock, capture_errors() as errors:
            rc = lib.mtmd_tokenize(self._ptr, out, c_text, c_bitmaps, len(bitmaps))
        if rc == 1:
            raise native_error(MediaCountError, "the media markers and bitmaps do not pair up", errors,
                               n_markers=n_markers, n_media=len(bitmaps))
        if rc != 0:
            raise native_error(MediaDecodeError, f"the projector could not preprocess the media (code {rc})", errors)
        return chunks

    def encode_chunk(self, chunk: MtmdInputChunk) -> np.ndarray:
        """The projector's embeddings of one media chunk, shape (n_tokens, n_embd): a copy."""
        if chunk.type == ChunkType.TEXT:
            raise InvalidParameterError("a text chunk has no media to encode", field="chunk")
        with self.lock:
            with capture_errors() as errors:
                rc = lib.mtmd_encode_chunk(self._ptr, chunk._ptr)
            if rc != 0:
                raise native_error(DecodeError, f"the projector failed to encode the {chunk.type.name.lower()} chunk",
                                   errors, code=int(rc))
            n_embd = self.model.n_embd
            out = lib.mtmd_get_output_embd(self._ptr)
            return np.frombuffer(ffi.buffer(out, chunk.n_tokens * n_embd * 4), dtype=np.float32).reshape(
                chunk.n_tokens, n_embd).copy()

    def __repr__(self) -> str:
        if self.closed:
            return "<MtmdContext closed>"
        return f"<MtmdContext {self.path.name} vision={self.support_vision()} audio={self.support_audio()}>"


def capabilities(mmproj_path: str | os.PathLike[str]) -> tuple[bool, bool]:
    """(vision, audio) of an mmproj file, from its metadata (no text model needed)."""
    path = Path(mmproj_path)
    if not path.is_file():
        raise ModelNotFoundError(f"mmproj file not found: {path}")
    route_log()
    with capture_errors() as errors:
        caps = lib.mtmd_get_cap_from_file(os.fsencode(path))
    if not (caps.inp_vision or caps.inp_audio):
        if errors:
            raise native_error(InvalidMmprojError, f"could not read {path} as a multimodal projector", errors)
        raise InvalidMmprojError(f"{path} has no vision and no audio encoder: not a multimodal projector (mmproj)")
    return bool(caps.inp_vision), bool(caps.inp_audio)


@dataclass(frozen=True)
class MtmdInputText:
    """Text for `MtmdContext.tokenize`: `add_special` adds BOS etc., `parse_special` reads special tokens."""

    text: str
    add_special: bool = True
    parse_special: bool = True


class MtmdBitmap(NativeHandle):
    """An image (RGB, nx x ny) or an audio clip (mono float32 PCM) for the projector."""

    _what = "bitmap"

    def __init__(self, ptr: Any):
        if ptr == ffi.NULL:
            raise MediaDecodeError("no bitmap")
        self._adopt(ptr, lib.mtmd_bitmap_free)

    # -- constructors --------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike[str], ctx: MtmdContext | None = None) -> MtmdBitmap:
        """An image (PNG, JPEG, BMP, GIF, ... as stb_image reads them) or audio (WAV, MP3, FLAC) file.

        Audio is resampled to the projector's rate, so it needs `ctx`; images do not.
        """
        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise MediaDecodeError(f"cannot read media file {p}: {exc.strerror or exc}", field="path") from None
        return cls.from_bytes(data, ctx, _name=str(p))

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, ctx: MtmdContext | None = None, *,
                   _name: str = "the bytes") -> MtmdBitmap:
        """The contents of an image or audio file (see `from_file`); the id is their sha256, as llama.cpp's."""
        data = bytes(data)
        if not data:
            raise MediaDecodeError(f"{_name}: empty, not an image or audio file")
        audio = is_audio_bytes(data)
        if audio:
            if ctx is None:
                raise UnsupportedMediaError(f"{_name} is audio: decoding it needs the MtmdContext (its sample rate), "
                                            "MtmdBitmap.from_bytes(data, ctx)")
            if not ctx.support_audio():
                raise UnsupportedMediaError(f"{_name} is audio, and {ctx.path.name} has no audio encoder")
        route_log()
        opt = lib.mtmd_helper_init_opt_default()
        with capture_errors() as errors:
            owner = ctx.raw_handle() if ctx is not None else ffi.NULL
            wrapper = lib.mtmd_helper_bitmap_init_from_buf(owner, ffi.from_buffer(data), len(data), False, opt)
        if wrapper.video_ctx != ffi.NULL:  # not built (no MTMD_VIDEO); never a leak if it ever is
            lib.mtmd_helper_video_free(wrapper.video_ctx)
        if wrapper.bitmap == ffi.NULL:
            kind = "audio" if audio else "image"
            raise native_error(MediaDecodeError, f"{_name}: not a readable {kind} (corrupt or unknown format)",
                               errors)
        bitmap = cls(wrapper.bitmap)
        if not audio and (bitmap.nx == 0 or bitmap.ny == 0):
            raise MediaDecodeError(f"{_name}: an image of {bitmap.nx}x{bitmap.ny} pixels")
        if audio and bitmap.n_bytes == 0:
            raise MediaDecodeError(f"{_name}: an audio clip with no samples")
        return bitmap

    @classmethod
    def from_array(cls, pixels: Any, id: str | None = None) -> MtmdBitmap:  # noqa: A002 - llama.cpp's name
        """An image from a numpy array of shape (height, width, 3), dtype uint8 (RGB)."""
        arr = np.asarray(pixels)
        if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
            raise InvalidParameterError(f"an image array must be (height, width, 3) uint8 RGB, got shape {arr.shape} "
                                        f"{arr.dtype}", field="pixels")
        if arr.shape[0] == 0 or arr.shape[1] == 0:
            raise MediaDecodeError(f"an image of {arr.shape[1]}x{arr.shape[0]} pixels", field="pixels")
        arr = np.ascontiguousarray(arr)
        bitmap = cls(lib.mtmd_bitmap_init(arr.shape[1], arr.shape[0], ffi.from_buffer(arr)))
        bitmap.id = id if id is not None else hashlib.sha256(arr.tobytes()).hexdigest()
        return bitmap

    @classmethod
    def from_audio(cls, samples: Any, id: str | None = None) -> MtmdBitmap:
        """An audio clip from mono PCM samples (float32 in [-1, 1]) at the projector's `audio_sample_rate`."""
        arr = np.ascontiguousarray(np.asarray(samples, dtype=np.float32))
        if arr.ndim != 1 or arr.size == 0:
            raise InvalidParameterError(f"audio must be a non-empty 1-D array of mono samples, got shape {arr.shape}",
                                        field="samples")
        if not np.isfinite(arr).all():
            raise MediaDecodeError("the audio samples contain NaN or infinity", field="samples")
        bitmap = cls(lib.mtmd_bitmap_init_from_audio(arr.size, ffi.from_buffer("float[]", arr)))
        bitmap.id = id if id is not None else hashlib.sha256(arr.tobytes()).hexdigest()
        return bitmap

    # -- properties ----------------------------------------------------------
    @property
    def nx(self) -> int:
        return int(lib.mtmd_bitmap_get_nx(self._ptr))

    @property
    def ny(self) -> int:
        return int(lib.mtmd_bitmap_get_ny(self._ptr))

    @property
    def is_audio(self) -> bool:
        return bool(lib.mtmd_bitmap_is_audio(self._ptr))

    @property
    def n_bytes(self) -> int:
        return int(lib.mtmd_bitmap_get_n_bytes(self._ptr))

    @property
    def id(self) -> str | None:
        raw = lib.mtmd_bitmap_get_id(self._ptr)
        return ffi.string(raw).decode() if raw != ffi.NULL else None

    @id.setter
    def id(self, value: str | None) -> None:
        lib.mtmd_bitmap_set_id(self._ptr, value.encode() if value is not None else ffi.NULL)

    @property
    def data(self) -> np.ndarray:
        """A copy: (ny, nx, 3) uint8 for an image, 1-D float32 samples for audio."""
        buf = ffi.buffer(lib.mtmd_bitmap_get_data(self._ptr), self.n_bytes)
        if self.is_audio:
            return np.frombuffer(buf, dtype=np.float32).copy()
        return np.frombuffer(buf, dtype=np.uint8).reshape(self.ny, self.nx, 3).copy()

    def __repr__(self) -> str:
        if self.closed:
            return "<MtmdBitmap closed>"
        if self.is_audio:
            return f"<MtmdBitmap audio {self.n_bytes // 4} samples>"
        return f"<MtmdBitmap image {self.nx}x{self.ny}>"


class MtmdInputChunk:
    """One chunk of an `MtmdInputChunks` (borrowed: valid while the chunks are open)."""

    def __init__(self, parent: MtmdInputChunks, index: int):
        self._parent, self.index = parent, index

    @property
    def _ptr(self) -> Any:
        return lib.mtmd_input_chunks_get(self._parent._ptr, self.index)

    @property
    def type(self) -> ChunkType:
        return ChunkType(int(lib.mtmd_input_chunk_get_type(self._ptr)))

    @property
    def n_tokens(self) -> int:
        return int(lib.mtmd_input_chunk_get_n_tokens(self._ptr))

    @property
    def n_pos(self) -> int:
        """Positions the chunk takes in the KV cache (n_tokens, except for M-RoPE models' images)."""
        return int(lib.mtmd_input_chunk_get_n_pos(self._ptr))

    @property
    def id(self) -> str | None:
        """The media's id (the bitmap's: sha256 of the file for from_file/from_bytes); None for text."""
        raw = lib.mtmd_input_chunk_get_id(self._ptr)
        return ffi.string(raw).decode() if raw != ffi.NULL else None

    @property
    def tokens(self) -> np.ndarray:
        """The text tokens of a text chunk (a copy); empty for media."""
        n = ffi.new("size_t *")
        ptr = lib.mtmd_input_chunk_get_tokens_text(self._ptr, n)
        if ptr == ffi.NULL or n[0] == 0:
            return np.zeros(0, dtype=np.int32)
        return np.frombuffer(ffi.buffer(ptr, n[0] * 4), dtype=np.int32).copy()

    @property
    def non_causal(self) -> bool:
        """Whether the text model attends to this chunk's tokens bidirectionally (e.g. Gemma 3 images)."""
        return bool(lib.mtmd_decode_use_non_causal(self._parent.ctx._ptr, self._ptr))

    def __repr__(self) -> str:
        return f"<MtmdInputChunk {self.type.name.lower()} n_tokens={self.n_tokens}>"


class MtmdInputChunks(NativeHandle):
    """The chunks of one tokenised prompt: iterate them, or `eval` them into a LlamaContext."""

    _what = "input chunks"

    def __init__(self, ptr: Any, ctx: MtmdContext):
        if ptr == ffi.NULL:
            raise MtmdTokenizeError("mtmd_input_chunks_init returned NULL")
        self._adopt(ptr, lib.mtmd_input_chunks_free)
        self.ctx = ctx

    def __len__(self) -> int:
        return int(lib.mtmd_input_chunks_size(self._ptr))

    def __getitem__(self, index: int) -> MtmdInputChunk:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"chunk {index} of {n}")
        return MtmdInputChunk(self, index % n)

    def __iter__(self) -> Iterator[MtmdInputChunk]:
        for i in range(len(self)):
            yield MtmdInputChunk(self, i)

    @property
    def n_tokens(self) -> int:
        return int(lib.mtmd_helper_get_n_tokens(self._ptr))

    @property
    def n_pos(self) -> int:
        return int(lib.mtmd_helper_get_n_pos(self._ptr))

    def eval(self, llama_context: LlamaContext, n_past: int | None = None, seq_id: int = 0, n_batch: int | None = None,
             logits_last: bool = True) -> int:
        """Decode every chunk into `llama_context` at n_past (default: its n_past); returns the new n_past.

        Media chunks are encoded by the projector and their embeddings decoded as the text model's
        input; text chunks are decoded as tokens; the last token gets logits when `logits_last`.
        """
        if not isinstance(llama_context, LlamaContext):
            raise InvalidParameterError(f"llama_context is a {type(llama_context).__name__}, not a LlamaContext",
                                        field="llama_context")
        if llama_context.model is not self.ctx.model:
            raise InvalidParameterError("the LlamaContext is on another model than this MtmdContext's",
                                        field="llama_context")
        mctx, lctx = self.ctx.raw_handle(), llama_context.raw_handle()
        n_past = llama_context.n_past if n_past is None else int(n_past)
        if n_past < 0:
            raise InvalidParameterError(f"n_past must be >= 0, got {n_past}", field="n_past")
        if not 0 <= seq_id < llama_context.n_seq_max:
            raise InvalidParameterError(f"seq_id {seq_id} is outside 0..{llama_context.n_seq_max - 1} (n_seq_max)",
                                        field="seq_id")
        n_batch = llama_context.n_batch if n_batch is None else int(n_batch)
        if not 0 < n_batch <= llama_context.n_batch:
            raise InvalidParameterError(f"n_batch must be in 1..{llama_context.n_batch} (the context's n_batch), "
                                        f"got {n_batch}", field="n_batch")
        chunks = list(self)
        if not chunks:
            raise InvalidParameterError("no chunks to evaluate", field="chunks")
        n_ctx = llama_context.n_ctx
        end = n_past + self.n_pos
        if end > n_ctx:
            media = [c for c in chunks if c.type != ChunkType.TEXT]
            what = (f"the largest media chunk ({max(media, key=lambda c: c.n_pos).type.name.lower()}) takes "
                    f"{max(c.n_pos for c in media)} positions; " if media else "")
            raise MediaTooLargeError(f"{self.n_pos} positions at n_past={n_past} do not fit in the context window "
                                     f"(n_ctx={n_ctx}): {what}raise n_ctx to at least {end} or use a smaller image")
        for c in chunks:
            if c.type != ChunkType.TEXT and c.non_causal and c.n_tokens > min(n_batch, llama_context.n_ubatch):
                raise MediaTooLargeError(
                    f"the {c.type.name.lower()} chunk {c.index} has {c.n_tokens} tokens, which this model attends to "
                    f"in one micro-batch: raise n_batch and n_ubatch to at least {c.n_tokens} "
                    f"(now {n_batch} and {llama_context.n_ubatch})")
        new_n_past = ffi.new("llama_pos *")
        with self.ctx.lock, capture_errors() as errors:
            rc = lib.mtmd_helper_eval_chunks(mctx, lctx, self._ptr, n_past, seq_id, n_batch, logits_last, new_n_past)
        if rc != 0:
            raise native_error(DecodeError, f"evaluating the chunks failed (code {rc}) at n_past={n_past}", errors,
                               code=int(rc))
        result = int(new_n_past[0])
        _after_eval(llama_context, chunks[-1], n_batch, logits_last, result, seq_id)
        return result

    def __repr__(self) -> str:
        if self.closed:
            return "<MtmdInputChunks closed>"
        return f"<MtmdInputChunks {[c.type.name.lower() for c in self]} n_tokens={self.n_tokens}>"


class MtmdTokenizeError(MediaDecodeError):
    """libmtmd could not allocate or fill the chunks."""


def _after_eval(llama_context: LlamaContext, last: MtmdInputChunk, n_batch: int, logits_last: bool, n_past: int,
                seq_id: int) -> None:
    """What the core's LlamaContext tracks after a decode: which tokens of the last batch have logits, n_past."""
    if last.type == ChunkType.TEXT:
        n = last.n_tokens
        size = n - n_batch * ((n - 1) // n_batch)  # the helper's last batch of this chunk
        outputs = np.zeros(size, dtype=np.int8)
        outputs[-1] = 1 if logits_last else 0
    else:
        outputs = np.zeros(0, dtype=np.int8)  # embeddings batches have no logits for sampling
    llama_context.note_decoded(outputs, n_past if seq_id == 0 else None)


def check_open(*objects: NativeHandle) -> None:
    for obj in objects:
        if obj.closed:
            raise ClosedError(f"this {obj._what} is closed")
