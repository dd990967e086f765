"""The one way the tests run Python in a child interpreter.

A crash, a hang or a state that is set once per process (the backend set, RPC servers, a signal
handler) stays in the child, and fails the test instead of killing or tainting pytest.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RESULT = "RESULT "


def run_isolated(code: str | Path, *args: str, env: Mapping[str, str | None] | None = None, path: str | None = None,
                 timeout: float = 120, cwd: str | Path | None = None, result: bool = False) -> Any:
    """Run `code` (source, dedented, or a script's path) with `args` in a fresh interpreter.

    env: changes to this process's environment (None removes a variable); PYTHONFAULTHANDLER is set,
    so a crash prints the Python stack. path: put first on PYTHONPATH. Returns the CompletedProcess
    (text; stdout and stderr captured), or with result=True the JSON value of the child's last line
    `RESULT <json>`: then the child must exit 0, and a failure shows the end of its stderr.
    """
    full_env = dict(os.environ, PYTHONFAULTHANDLER="1")
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    if path:
        full_env["PYTHONPATH"] = path + os.pathsep + full_env.get("PYTHONPATH", "")
    program = [str(code)] if isinstance(code, Path) else ["-c", textwrap.dedent(code)]
    done = subprocess.run([sys.executable, *program, *args], capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=cwd)
    if not result:
        return done
    assert done.returncode == 0, f"child failed (rc {done.returncode}):\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    assert lines, f"the child printed no {RESULT!r}line:\n{done.stdout[-2000:]}"
    return json.loads(lines[-1][len(RESULT):])


class Terminal:
    """What a child on the pty `fd` (pty.fork) has written, in `seen`, read as far as a marker."""

    def __init__(self, fd: int):
        self.fd, self.seen = fd, b""

    def until(self, marker: bytes, count: int = 1, timeout: float = 120) -> None:
        """Read until `marker` (the child's prompt, say) has shown `count` times, or the child has closed it."""
        end = time.monotonic() + timeout
        while self.seen.count(marker) < count:
            assert time.monotonic() < end, self.seen[-500:]
            if select.select([self.fd], [], [], 0.5)[0]:
                try:
                    self.seen += os.read(self.fd, 4096)
                except OSError:  # the child has gone: the pty reads as an error
                    break
