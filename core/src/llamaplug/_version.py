"""Versions: llamaplug's own (from the repository's VERSION file) and the llama.cpp pin."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("llamaplug")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

try:
    from ._build_info import GGML_VERSION, LLAMA_CPP_COMMIT
except ImportError:  # not built
    LLAMA_CPP_COMMIT = GGML_VERSION = "unknown"
