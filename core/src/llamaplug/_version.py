"""Versions: llamaplug's own (from the repository's VERSION file) and the llama.cpp pin."""

from __future__ import annotations

try:  # written by the build: importlib.metadata would cost 60 ms at `import llamaplug`
    from ._build_info import GGML_VERSION, LLAMA_CPP_COMMIT
    from ._build_info import VERSION as __version__
except ImportError:  # not built
    LLAMA_CPP_COMMIT = GGML_VERSION = "unknown"
    __version__ = "0+unknown"
