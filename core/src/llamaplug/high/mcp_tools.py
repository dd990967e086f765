"""The tools of MCP servers (the Model Context Protocol), declared and run as llama-server runs them.

The config is llama-server's (`--mcp-servers-config`, Cursor's shape): `{"mcpServers": {NAME: {"command",
"args", "env", "cwd", "timeout_ms"}}}`; only stdio servers. Each server is started once to list its tools, then
stopped, and started again for each call (llama-server does the same: no child is left running between calls, and
one that crashed costs one call). A tool is offered to the model as `<server>_<tool>`, an OpenAI function.

The client is the official `mcp` SDK (the `mcp` extra), imported when a config is read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InvalidParameterError

log = logging.getLogger("llamaplug.mcp")

# llama-server's per-call default (timeout_ms)
DEFAULT_CALL_TIMEOUT = 30.0


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
    """The tools of the configured servers, listed by `start()`; `call()` runs one."""

    # call()'s result when its `limit`, not the server's own timeout, stopped it
    OUT_OF_TIME = McpResult("error: out of time", True)

    def __init__(self, servers: Sequence[McpServer]) -> None:
        self.servers = {s.name: s for s in servers}
        self.tools: dict[str, McpTool] = {}

    @classmethod
    def from_config(cls, path: str | os.PathLike[str]) -> McpTools:
        return cls(read_config(path))

    @classmethod
    def from_sources(cls, path: str | os.PathLike[str] | None, text: str | None) -> McpTools:
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
        return cls(servers)

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
        `limit`: the seconds the caller has left (OUT_OF_TIME when they run out before the server's timeout)."""
        tool = self.tools[name]
        try:
            given = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return McpResult(f"error: the arguments are not JSON: {exc}", True)
        if not isinstance(given, dict):
            return McpResult("error: the arguments must be a JSON object", True)
        server = self.servers[tool.server]

        async def run() -> Any:
            async with _client(server) as client:
                return await client.call_tool(tool.tool, given)

        cut = limit is not None and limit < server.timeout
        try:
            result = await asyncio.wait_for(run(), limit if cut else server.timeout)
        except asyncio.TimeoutError:
            if cut:
                return self.OUT_OF_TIME
            return McpResult(f"error: {name} took more than {server.timeout:g} s", True)
        except Exception as exc:  # the server's failure is the call's result, not the request's
            log.warning("MCP tool %s failed: %s", name, exc)
            return McpResult(f"error: {name} failed: {exc}", True)
        texts = [part.text for part in getattr(result, "content", []) if getattr(part, "type", None) == "text"]
        return McpResult("\n".join(texts), bool(getattr(result, "is_error", False)))

    async def _list(self, server: McpServer) -> list[McpTool]:
        async def run() -> Any:
            async with _client(server) as client:
                return (await client.list_tools()).tools

        try:
            listed = await asyncio.wait_for(run(), server.timeout)
        except InvalidParameterError:
            raise
        except Exception as exc:
            raise InvalidParameterError(f"MCP server {server.name!r} ({server.command}) did not list its tools: "
                                        f"{exc or type(exc).__name__}", field=f"mcpServers.{server.name}") from None
        return [McpTool(server.name, t.name, t.description or "",
                        t.input_schema if isinstance(t.input_schema, dict) else {"type": "object"})
                for t in listed]


def _client(server: McpServer) -> Any:
    try:
        from mcp import Client, StdioServerParameters
    except ImportError:
        raise InvalidParameterError('MCP servers need the mcp SDK: pip install "llamaplug[mcp]"',
                                    field="mcp_config") from None
    params = StdioServerParameters(command=server.command, args=list(server.args), env=server.env, cwd=server.cwd)
    return Client(params)
