"""MCP servers as the pin's test_mcp_servers.py starts them (issue 48 part 6): `--mcp-servers-json` (inline JSON, not
a file), a server that cannot start left out while the others serve, and each tool run by POST /tools as
`<server>_<tool>`. The same script against the pin's llama-server and `llamaplug serve`, compared.
"""

from __future__ import annotations

import json
import sys
import urllib.request

from fixtures import mcp_lookup_server
from llamaplug_testing import on_both, post_status

CONFIG = {"mcpServers": {
    "lookup": {"command": sys.executable, "args": [mcp_lookup_server.__file__]},
    # no such program: llama-server's warmup warns and goes on without its tools
    "broken": {"command": "llamaplug-test-no-such-command-48", "args": []},
}}


def _script(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/tools", timeout=60) as resp:
        listed = sorted(t["tool"] for t in json.loads(resp.read()))
    return {"listed": listed,
            "multiply": post_status(port, "/tools", {"tool": "lookup_multiply", "params": {"a": 6, "b": 7}}),
            "secret": post_status(port, "/tools", {"tool": "lookup_secret_word", "params": {"topic": "zebra"}})}


def test_mcp_servers_json_lists_and_runs_tools_as_llama_server(native_tools, smollm2_path):
    both = on_both(native_tools, smollm2_path, _script, "-c", "512", "--mcp-servers-json", json.dumps(CONFIG))
    theirs, ours = both["theirs"], both["ours"]
    assert "lookup_multiply" in theirs["listed"] and not any(t.startswith("broken_") for t in theirs["listed"])
    assert theirs["multiply"][0] == 200 and "plain_text_response" in theirs["multiply"][1]
    assert ours == theirs
