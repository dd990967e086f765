"""POST /tools: one built-in tool call, as llama-server's (added to the app only by `serve --tools` or MCP servers,
whose tools it runs too).

{"tool": NAME, "params": {...}, "stream": false}; headers: x-tool-cwd (the folder relative paths and the shell
start from: the model's own "cwd" param is dropped), x-resp-type: base64 (read_file's whole file), x-tool-runtime.
An unknown tool is a 404; a tool's own failure a 200 {"error": ...}; a param of the wrong shape a 400 naming it.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..api_error import BadRequestError, NotFoundError, NotSupportedError
from ..dialects import NATIVE
from ..errors import ERROR_RESPONSES
from . import files, search, shell
from .fields import Params

router = NATIVE.router()


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    tool: str = Field(description="the tool's name, as GET /tools lists it")
    params: dict[str, Any] = Field(default_factory=dict, description="the tool's arguments")
    stream: bool = Field(False, description="exec_shell_command only: its output as server-sent events")


# in a worker thread (files and folders); read_file apart, as it also takes x-resp-type
_SYNC = {"write_file": files.write_file, "edit_file": files.edit_file, "file_glob_search": search.file_glob_search,
         "grep_search": search.grep_search}
_ASYNC = {"exec_shell_command": shell.exec_shell_command, "get_info": shell.get_info}


def check_runtime(spec: str) -> None:
    """x-tool-runtime: llama-server's messages for a spec it refuses, as a 400 naming the header (llama-server
    answers 500, which its tests pin: a client's bad header is not a server fault here, as for a bad body), and a
    501 for one it would run: tools run on this host only here, and a call that names an isolate never runs on it."""
    engine = re.match(r"(docker|podman)(-container)?:(.*)", spec, re.DOTALL)
    if engine:
        if not engine.group(2):
            refused = "tool runtime must name a running container: " + spec
        elif not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", engine.group(3)):
            refused = "invalid container id: " + engine.group(3)
        else:
            refused = ""
    elif spec.startswith("ssh:"):
        refused = "" if re.fullmatch(r"[A-Za-z0-9._@][A-Za-z0-9._@-]*", spec[4:]) else "invalid ssh target: " + spec[4:]
    else:
        refused = "unknown tool runtime: " + spec
    if refused:
        raise BadRequestError("x-tool-runtime: " + refused, param="x-tool-runtime")
    raise NotSupportedError(f"x-tool-runtime {spec}: llamaplug serve runs its tools on this host only (llama-server's "
                            "container and ssh runtimes are not implemented)", param="x-tool-runtime")


@router.post("/tools", responses=ERROR_RESPONSES)
async def call_tool(body: ToolCall, request: Request) -> Any:
    enabled: list[str] = request.app.state.builtin_tools
    mcp = getattr(request.app.state, "mcp", None)
    if body.tool not in enabled and mcp is not None and body.tool in mcp.tools:
        return await call_mcp_tool(mcp, body)
    if body.tool not in enabled:
        raise NotFoundError(f'unknown tool "{body.tool}"', param="tool")
    if body.stream and body.tool != "exec_shell_command":
        raise NotFoundError(f'tool "{body.tool}" does not support stream = true', param="stream")
    runtime = request.headers.get("x-tool-runtime", "")
    if runtime:
        check_runtime(runtime)
    params = Params({k: v for k, v in body.params.items() if k not in ("cwd", "runtime", "resp_type")},
                    request.headers.get("x-tool-cwd", ""))
    if body.stream:
        run = shell.command_run(params)  # a bad param is a 400 before the stream's 200

        async def events():
            async for chunk in shell.exec_shell_command_stream(run):
                yield f"data: {json.dumps({'chunk': chunk})}\n\n"
            yield f"data: {json.dumps({'done': True})}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")
    if body.tool in _ASYNC:
        return await _ASYNC[body.tool](params)
    if body.tool == "read_file":
        resp_type = request.headers.get("x-resp-type", "")
        return await asyncio.to_thread(files.read_file, params, resp_type)
    return await asyncio.to_thread(_SYNC[body.tool], params)


async def call_mcp_tool(mcp: Any, body: ToolCall) -> dict[str, str]:
    """An MCP server's tool (`<server>_<tool>`, as GET /tools lists it), answered as llama-server answers it: its
    text parts as {"plain_text_response"}, or {"error"} when it failed (a 200 either way: the tool's own failure)."""
    if body.stream:
        raise NotFoundError(f'tool "{body.tool}" does not support stream = true', param="stream")
    result = await mcp.call(body.tool, json.dumps(body.params))
    if result.is_error:
        return {"error": result.text or "MCP tool returned an error"}
    return {"plain_text_response": result.text}
