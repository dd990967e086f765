"""The plugin's failures, each a llamaplug.LlamaError subclass naming the problem."""

from __future__ import annotations

from llamaplug.errors import ContextOverflowError, InvalidModelError, InvalidParameterError, LlamaError


class MtmdError(LlamaError):
    """Base of the multimodal plugin's errors."""


class InvalidMmprojError(MtmdError, InvalidModelError):
    """The mmproj file cannot be loaded as a projector (missing, corrupt, unknown projector type)."""


class MmprojMismatchError(InvalidMmprojError):
    """The projector's output embedding size is not the text model's: they are not a pair."""


class MediaDecodeError(MtmdError, InvalidParameterError):
    """An image or audio input could not be read or decoded (unreadable file, corrupt or unknown format)."""

    def __init__(self, message: str, field: str | None = "media"):
        super().__init__(message, field=field)


class UnsupportedMediaError(MtmdError, InvalidParameterError):
    """The projector cannot take this kind of media (audio for a vision-only mmproj, a URL that is not local)."""

    def __init__(self, message: str, field: str | None = "media"):
        super().__init__(message, field=field)


class MediaCountError(MtmdError, InvalidParameterError):
    """The prompt's media markers and the media given differ in number."""

    def __init__(self, message: str, n_markers: int, n_media: int):
        super().__init__(message, field="bitmaps")
        self.n_markers, self.n_media = n_markers, n_media


class MediaTooLargeError(MtmdError, ContextOverflowError):
    """The chunks (an image's tokens) do not fit in the context window or in one micro-batch."""
