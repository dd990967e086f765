"""llamaplug's test support, importable from every test folder (`pythonpath` in the root pyproject.toml).

The root tests/, core/tests and plugins/*/tests import from here: the paths and settings, the one way
to run Python in a child process (`run_isolated`), the servers, and greedy decoding. The shared pytest
fixtures (the real model, the pinned tree, the native tools, an RPC server) are `pytest_fixtures`, which
the root conftest.py loads for every folder; the GPU backends' child run and comparison with CPU are
`gpu`; the file-building fixtures (tiny GGUFs, corrupted GGUFs) stay in tests/fixtures/ (CONVENTIONS.md).
"""

from __future__ import annotations

from .child import Terminal, run_isolated
from .generation import greedy, llama_completion
from .servers import RestartableServer, free_port, llama_server, llamaplug_server, on_both, post_json, post_status
from .settings import CHATML, REPO, THREADS

__all__ = ["CHATML", "REPO", "THREADS", "RestartableServer", "Terminal", "free_port", "greedy", "llama_completion",
           "llama_server", "llamaplug_server", "on_both", "post_json", "post_status", "run_isolated"]
