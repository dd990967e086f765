"""llama-server's built-in tools for its web UI (`serve --tools`): files, search and a shell on this host.

POST /tools {"tool", "params", "stream"} runs one, GET /tools lists them (server/mcp/routes.py, beside the MCP
servers' tools). Off by default: the routes are added only when `serve --tools NAMES|all` is given, as llama-server
(tools/server/server-tools.cpp), whose behaviour each tool follows: its parameters, answers, limits (16 KB read,
16 KB of output, a 60 s shell, 100 results) and its errors, a 200 {"error": ...} for what went wrong with the
file or the search (the model reads it) and a 4xx naming the field for a request that is not the tool's shape.
They do what the server's user may do: anyone who can reach the server can read, write and run anything as it.
"""

from __future__ import annotations

# llama-server's order (build_tools), which GET /tools keeps
NAMES = ("read_file", "file_glob_search", "grep_search", "exec_shell_command", "write_file", "edit_file", "get_info")
