"""exec_shell_command and get_info, as llama-server's: `sh -c COMMAND` in the call's cwd, stdout and stderr
together, 16 KB of output and 60 s at most. One difference, said here: at its timeout or when its client goes,
the command's whole process group is killed (llama-server kills the shell only, and what it started in the
background keeps its output pipe open)."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

from .fields import Params

MAX_OUTPUT = 16 * 1024
MAX_TIMEOUT = 60  # seconds


class Run:
    """One command: `chunks()` yields its output as it comes (what is kept: max_output bytes), then `exit_code`
    (-1: it could not start) and `timed_out` are set."""

    def __init__(self, args: list[str], cwd: str, max_output: int, timeout: float):
        self.args, self.cwd, self.max_output, self.timeout = args, cwd, max_output, timeout
        self.exit_code, self.timed_out, self.truncated, self.output = -1, False, False, ""

    async def chunks(self) -> AsyncIterator[str]:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.args, cwd=self.cwd or None, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError:
            self.output = "failed to spawn process"
            yield self.output
            return
        decoder, kept = codecs.getincrementaldecoder("utf-8")("replace"), 0
        deadline = asyncio.get_running_loop().time() + self.timeout
        try:
            assert proc.stdout is not None
            while True:
                left = deadline - asyncio.get_running_loop().time()
                try:
                    data = await asyncio.wait_for(proc.stdout.read(4096), max(left, 0))
                except asyncio.TimeoutError:
                    self.timed_out = True
                    _kill(proc)
                    break
                if not data:
                    break
                if len(data) > self.max_output - kept:  # drained on past the cap: a full pipe would block it
                    self.truncated = True
                    data = data[:self.max_output - kept]
                kept += len(data)
                text = decoder.decode(data)
                self.output += text
                if text:
                    yield text
            self.output += decoder.decode(b"", final=True)
            code = await proc.wait()
            self.exit_code = code if code >= 0 else 1  # killed by a signal: subprocess.h's join says 1
        finally:
            if proc.returncode is None:  # the client went away (the generator closed) or the timeout hit
                _kill(proc)
                with contextlib.suppress(ProcessLookupError):
                    await proc.wait()
        if self.truncated:  # in the whole answer only, as llama-server's stream has no such chunk
            self.output += "\n[output truncated]"


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _tail(run: Run) -> str:
    return f"\n[exit code: {run.exit_code}]" + (" [exit due to timed out]" if run.timed_out else "")


def command_run(params: Params) -> Run:
    """The run exec_shell_command's params ask for (their faults raised now, before a stream starts)."""
    command = params.string("command")
    timeout = min(params.integer("timeout", 10, minimum=1), MAX_TIMEOUT)
    max_output = min(params.integer("max_output_size", MAX_OUTPUT, minimum=0), MAX_OUTPUT)
    return Run(["sh", "-c", command], params.cwd, max_output, timeout)


async def exec_shell_command(params: Params) -> dict[str, Any]:
    run = command_run(params)
    async for _ in run.chunks():
        pass
    return {"plain_text_response": run.output + _tail(run)}


async def exec_shell_command_stream(run: Run) -> AsyncIterator[str]:
    """Its output in chunks, then the exit code line (llama-server's stream)."""
    async for chunk in run.chunks():
        yield chunk
    yield _tail(run)


async def get_info(params: Params) -> dict[str, Any]:
    run = Run(["uname", "-a"], params.cwd, 4096, 5)
    async for _ in run.chunks():
        pass
    os_info = run.output.strip() if run.exit_code == 0 and not run.timed_out else "unknown"
    return {"os": os_info, "cwd": params.cwd or os.getcwd()}
