"""The tools of MCP servers (the Model Context Protocol), declared and run as llama-server runs them.

The config is llama-server's (`--mcp-servers-config`, Cursor's shape): `{"mcpServers": {NAME: {"command",
"args", "env", "cwd", "timeout_ms"}}}`; only stdio servers. Each server is started once to list its tools, then
stopped. With `keep` (serve, as llama-server's server_mcp) a server is started again at its first call and kept
for the calls after, one process and one session a server (a server that keeps state between calls sees them
all), started again when it has died; `close()` (serve's first shutdown signal) ends the calls running and the
processes. Without it (`llamaplug chat`, whose turns each run their own event loop) a server is started for each
call and stopped after it. A tool is offered to the model as `<server>_<tool>`, an OpenAI function.

The client is the official `mcp` SDK (the `mcp` extra), imported when a config is read; its stdio transport is
replaced by `_stdio` here, which knows its process: a dead one is seen before a call, and a closed one is killed
at once (the SDK's waits 2 s for a server to leave after its stdin closes, a busy one cannot).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import ClosedError, InvalidParameterError

log = logging.getLogger("llamaplug.mcp")

# llama-server's per-call default (timeout_ms)
DEFAULT_CALL_TIMEOUT = 30.0
# seconds a server has to list its tools at start (llama-server's MCP_WARMUP_TIMEOUT_SECONDS: not timeout_ms, which
# bounds a call; a Python server alone takes more than the pin suite's 0.5 s to start on a loaded machine)
WARMUP_TIMEOUT = 10.0
# seconds a server has to leave after SIGTERM before SIGKILL, and then to be seen gone
KILL_AFTER = 1.0


@dataclasses.dataclass(frozen=True)
class McpServer:
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    cwd: str | None = None
    timeout: float = DEFAULT_CALL_TIMEOUT  # seconds a call (its start included) may take


@dataclasses.dataclass(frozen=True)
class McpTool:
    server: str
    tool: str
    description: str
    parameters: dict[str, Any]

    @property
    def name(self) -> str:
        """The name the model calls it by: llama-server's `<server>_<tool>`."""
        return f"{self.server}_{self.tool}"

    def definition(self) -> dict[str, Any]:
        """The OpenAI function tool offered to the model."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclasses.dataclass(frozen=True)
class McpResult:
    text: str  # what the model reads: the result's text parts, or the error
    is_error: bool


def read_config(path: str | os.PathLike[str]) -> list[McpServer]:
    """The servers a config file declares; an InvalidParameterError naming the file and the key that is wrong."""
    where = Path(path)
    try:
        config = json.loads(where.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidParameterError(f"cannot read the MCP config {where}: {exc.strerror}", field="mcp_config") \
            from None
    except ValueError as exc:
        raise InvalidParameterError(f"the MCP config {where} is not JSON: {exc}", field="mcp_config") from None
    return parse_config(config, str(where))


def parse_config(config: Any, where: str = "the MCP config") -> list[McpServer]:
    declared = config.get("mcpServers") if isinstance(config, dict) else None
    if not isinstance(declared, dict):
        raise InvalidParameterError(f'{where} must be {{"mcpServers": {{NAME: {{"command": ..., "args": [...]}}}}}}',
                                    field="mcpServers")
    servers = []
    for name, entry in declared.items():
        key = f"mcpServers.{name}"
        if not name or not all(c.isalnum() or c in "-_" for c in name):
            raise InvalidParameterError(f"{where}: server name {name!r} must be letters, digits, - or _ (it "
                                        "prefixes its tools' names)", field=key)
        if not isinstance(entry, dict) or not isinstance(entry.get("command"), str) or not entry["command"]:
            raise InvalidParameterError(f"{where}: {key} needs a command (only stdio servers are run)",
                                        field=f"{key}.command")
        args, env, cwd = entry.get("args", []), entry.get("env"), entry.get("cwd")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise InvalidParameterError(f"{where}: {key}.args must be a list of strings", field=f"{key}.args")
        if env is not None and (not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values())):
            raise InvalidParameterError(f"{where}: {key}.env must map names to strings", field=f"{key}.env")
        if cwd is not None and not isinstance(cwd, str):
            raise InvalidParameterError(f"{where}: {key}.cwd must be a path", field=f"{key}.cwd")
        timeout_ms = entry.get("timeout_ms", DEFAULT_CALL_TIMEOUT * 1000)
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or timeout_ms <= 0:
            raise InvalidParameterError(f"{where}: {key}.timeout_ms must be a positive number",
                                        field=f"{key}.timeout_ms")
        servers.append(McpServer(name, entry["command"], tuple(args), env, cwd, timeout_ms / 1000))
    return servers


class McpTools:
    """The tools of the configured servers, listed by `start()`; `call()` runs one. `keep`: as the module says."""

    # call()'s result when its `limit`, not the server's own timeout, stopped it
    OUT_OF_TIME = McpResult("error: out of time", True)

    def __init__(self, servers: Sequence[McpServer], keep: bool = False) -> None:
        self.servers = {s.name: s for s in servers}
        self.tools: dict[str, McpTool] = {}
        self.keep = keep
        self._kept: dict[str, _Kept] = {}
        self._calls: set[asyncio.Future[Any]] = set()  # running, for close() to end
        self._closed = False

    @classmethod
    def from_config(cls, path: str | os.PathLike[str], keep: bool = False) -> McpTools:
        return cls(read_config(path), keep)

    @classmethod
    def from_sources(cls, path: str | os.PathLike[str] | None, text: str | None, keep: bool = False) -> McpTools:
        """The servers of a config file and of inline JSON text (llama-server's --mcp-servers-config and
        --mcp-servers-json, both read as it reads them: a name the file already has is skipped)."""
        servers = read_config(path) if path is not None else []
        if text is not None:
            try:
                config = json.loads(text)
            except ValueError as exc:
                raise InvalidParameterError(f"--mcp-servers-json is not JSON: {exc}", field="mcp_json") from None
            for server in parse_config(config, "--mcp-servers-json"):
                if any(s.name == server.name for s in servers):
                    log.warning("MCP server %s of --mcp-servers-json: the name is taken, skipped", server.name)
                    continue
                servers.append(server)
        return cls(servers, keep)

    async def start(self, skip_failed: bool = False) -> McpTools:
        """List every server's tools (each server started and stopped); a server that fails is an error naming it,
        or with `skip_failed` (llama-server's warmup) a warning, and its tools are not offered."""
        listed = await asyncio.gather(*(self._list(s) for s in self.servers.values()),
                                      return_exceptions=skip_failed)
        for tools in listed:
            if isinstance(tools, BaseException):
                if not isinstance(tools, InvalidParameterError) or tools.field == "mcp_config":  # (no mcp SDK)
                    raise tools
                log.warning("%s", tools)
                continue
            for tool in tools:
                if tool.name in self.tools:  # llama-server skips a colliding name too
                    log.warning("MCP tool %s of server %s: the name is taken, skipped", tool.tool, tool.server)
                    continue
                self.tools[tool.name] = tool
        return self

    def offered(self, server: str, allowed: Sequence[str] | None = None) -> list[McpTool]:
        """The tools of `server` (a KeyError for an unknown one), only those named in `allowed` if given."""
        if server not in self.servers:
            raise KeyError(server)
        return [t for t in self.tools.values() if t.server == server and (allowed is None or t.tool in allowed)]

    async def call(self, name: str, arguments: str, limit: float | None = None) -> McpResult:
        """Run the tool the model called `name` with its JSON `arguments`; a failure is a result the model reads.
        `limit`: the seconds the caller has left (OUT_OF_TIME when they run out before the server's timeout).
        A ClosedError once close() was called, or when it is called during the call."""
        tool = self.tools[name]
        try:
            given = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return McpResult(f"error: the arguments are not JSON: {exc}", True)
        if not isinstance(given, dict):
            return McpResult("error: the arguments must be a JSON object", True)
        server = self.servers[tool.server]
        if self._closed:
            raise ClosedError(f"MCP tool {name}: the MCP servers are closed (the server is shutting down)")

        async def run() -> Any:
            if self.keep:
                kept = self._kept.setdefault(server.name, _Kept(server))
                return await (await kept.client()).call_tool(tool.tool, given)
            async with _client(server) as client:
                return await client.call_tool(tool.tool, given)

        cut = limit is not None and limit < server.timeout
        # a task of its own, which close() cancels: asyncio.wait, not wait_for, tells that from this task's own
        # cancellation (a client gone), which goes on up
        job = asyncio.ensure_future(run())
        self._calls.add(job)
        try:
            done, _ = await asyncio.wait({job}, timeout=limit if cut else server.timeout)
        finally:
            self._calls.discard(job)
            job.cancel()
        if not done:
            if cut:
                return self.OUT_OF_TIME
            return McpResult(f"error: {name} took more than {server.timeout:g} s", True)
        if job.cancelled():  # only close() cancels it
            raise ClosedError(f"MCP tool {name}: stopped, the server is shutting down")
        try:
            result = job.result()
        except Exception as exc:  # the server's failure is the call's result, not the request's
            log.warning("MCP tool %s failed: %s", name, exc)
            return McpResult(f"error: {name} failed: {exc}", True)
        texts = [part.text for part in getattr(result, "content", []) if getattr(part, "type", None) == "text"]
        return McpResult("\n".join(texts), bool(getattr(result, "is_error", False)))

    async def close(self) -> None:
        """End the calls running (each a ClosedError) and stop the kept servers; later calls are ClosedErrors.
        Call it on the event loop the calls ran on."""
        self._closed = True
        for job in list(self._calls):
            job.cancel()
        kept, self._kept = list(self._kept.values()), {}
        await asyncio.gather(*(k.close() for k in kept), return_exceptions=True)

    async def _list(self, server: McpServer) -> list[McpTool]:
        async def run() -> Any:
            async with _client(server) as client:
                return (await client.list_tools()).tools

        try:
            listed = await asyncio.wait_for(run(), WARMUP_TIMEOUT)
        except InvalidParameterError:
            raise
        except Exception as exc:
            raise InvalidParameterError(f"MCP server {server.name!r} ({server.command}) did not list its tools: "
                                        f"{exc or type(exc).__name__}", field=f"mcpServers.{server.name}") from None
        return [McpTool(server.name, t.name, t.description or "",
                        t.input_schema if isinstance(t.input_schema, dict) else {"type": "object"})
                for t in listed]


class _Kept:
    """One server's process and SDK session, kept between calls. The SDK's client is entered and left in one
    task (anyio's cancel scopes), `_hold`, which waits between calls until close()."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.link = _Link()
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()  # one start at a time; calls on a started session run side by side

    async def client(self) -> Any:
        """The session, started (again) when there is none or its process has left."""
        async with self._lock:
            if self._client is not None and self.link.alive():
                return self._client
            if self._task is not None:
                log.warning("MCP server %s has stopped (exit status %s): starting it again", self.server.name,
                            getattr(self.link.process, "returncode", None))
                await self.close()
            self.link = _Link()
            ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._task = asyncio.ensure_future(self._hold(ready, self._stop))
            # shielded: a call cancelled while the server starts leaves the start to finish (or close() to end)
            return await asyncio.shield(ready)

    async def _hold(self, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        try:
            async with _client(self.server, self.link) as client:
                self._client = client
                ready.set_result(client)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ClosedError("MCP server stopped"))
            if not isinstance(exc, Exception):
                raise
            if ready.exception() is not exc:
                log.warning("MCP server %s: %s", self.server.name, exc)
        finally:
            self._client = None

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        if self._stop is not None:
            self._stop.set()
        if self.link.process is not None:  # at once: a server busy with a call does not read its stdin's end
            _kill(self.link.process, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(task), 2 * KILL_AFTER + 1)
        except Exception:  # (logged by _hold)
            task.cancel()


class _Link:
    """What `_stdio` tells of its server: the process, and whether its stdout is still open."""

    def __init__(self) -> None:
        self.process: Any = None  # anyio's Process, once started
        self.reading = True

    def alive(self) -> bool:
        # stdout's end comes first: the exit status only once the event loop has seen the child leave
        return self.reading and self.process is not None and self.process.returncode is None


def _client(server: McpServer, link: _Link | None = None) -> Any:
    try:
        from mcp import Client
    except ImportError:
        raise InvalidParameterError('MCP servers need the mcp SDK: pip install "llamaplug[mcp]"',
                                    field="mcp_config") from None
    return Client(_stdio(server, link or _Link()))


@contextlib.asynccontextmanager
async def _stdio(server: McpServer, link: _Link) -> AsyncIterator[Any]:
    """The SDK's stdio transport (newline-delimited JSON-RPC over the server's stdin and stdout, its stderr ours),
    less its close: here the server's process group is sent SIGTERM at once (llama-server kills its child too),
    SIGKILL after KILL_AFTER."""
    import anyio
    import mcp_types
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage

    process = await anyio.open_process([server.command, *server.args],
                                       env=get_default_environment() | (server.env or {}), cwd=server.cwd,
                                       stderr=None, start_new_session=True)  # its own group: its children too
    link.process = process
    to_session, from_server = anyio.create_memory_object_stream[Any](0)
    to_server, from_session = anyio.create_memory_object_stream[Any](0)

    async def read() -> None:
        buffer = b""
        async with to_session:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for chunk in process.stdout:
                    *lines, buffer = (buffer + chunk).split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        try:
                            message: Any = SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(
                                line, by_name=False))
                        except ValueError as exc:  # the session reads it as the SDK's transport gives it
                            message = exc
                        await to_session.send(message)
        link.reading = False

    async def write() -> None:
        try:
            async with from_session:
                async for message in from_session:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((text + "\n").encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await to_session.aclose()  # the session sees the end, not a request waiting for ever

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        tasks.start_soon(write)
        try:
            yield from_server, to_server
        finally:
            _kill(process, signal.SIGTERM)  # before any await: a cancelled caller still stops it
            with anyio.CancelScope(shield=True):
                if not await _gone(process, KILL_AFTER):
                    _kill(process, signal.SIGKILL)
                    await _gone(process, KILL_AFTER)
                for stream in (process.stdin, process.stdout, from_server, to_server):
                    with contextlib.suppress(Exception):
                        await stream.aclose()
            tasks.cancel_scope.cancel()  # a reader a surviving grandchild's pipe end keeps waiting


def _kill(process: Any, sig: int) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if sys.platform == "win32":
            process.kill()
        else:
            os.killpg(process.pid, sig)


async def _gone(process: Any, seconds: float) -> bool:
    """Whether `process` exited within `seconds` (its returncode polled: process.wait() also waits for its pipes'
    end, which a grandchild holding them delays)."""
    import anyio

    with anyio.move_on_after(seconds):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None
