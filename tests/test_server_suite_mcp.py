"""MCP servers as the pin's test_mcp_servers.py starts them (issue 48 part 6): `--mcp-servers-json` (inline JSON, not
a file), a server that cannot start left out while the others serve, and each tool run by POST /tools as
`<server>_<tool>`; one process a server kept between calls, started again after it died; a tool call running ends
at the first SIGTERM. The same script against the pin's llama-server and `llamaplug serve`, compared.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from fixtures import mcp_lookup_server
from llamaplug_testing import THREADS, free_port, on_both, post_status
from llamaplug_testing.servers import wait_healthy

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


# A server whose answers tell its process apart (the pin's mcp_echo_server's fail_once: a state kept in the process).
COUNTER = '''
import os
from mcp.server.mcpserver import MCPServer

server = MCPServer("counter")
calls = []


@server.tool()
def count() -> str:
    """How many calls this process has answered, this one included."""
    calls.append(1)
    return str(len(calls))


@server.tool()
def leave() -> str:
    """The process exits (a crash)."""
    os._exit(3)


@server.tool()
def wait(seconds: float) -> str:
    """Sleep, after writing that it started to the file $MCP_STARTED."""
    import time
    with open(os.environ["MCP_STARTED"], "a") as started:
        started.write("wait\\n")
    time.sleep(seconds)
    return "waited"


if __name__ == "__main__":
    server.run()
'''


def _counter_config(tmp_path, started: str = "") -> str:
    script = tmp_path / "mcp_counter_server.py"
    script.write_text(COUNTER)
    return json.dumps({"mcpServers": {"counter": {"command": sys.executable, "args": [str(script)],
                                                  "env": {"MCP_STARTED": started or str(tmp_path / "started")}}}})


def _count_script(port: int) -> dict:
    def call(tool: str) -> tuple[int, dict]:
        return post_status(port, "/tools", {"tool": f"counter_{tool}", "params": {}})

    kept = [call("count") for _ in range(3)]
    status, body = call("leave")  # the server dies mid-call: the call's error, then a new process at the next
    return {"kept": kept, "left": (status, sorted(body)), "after": [call("count") for _ in range(2)]}


def test_mcp_server_kept_between_calls_and_started_again_after_it_died(native_tools, smollm2_path, tmp_path):
    # llama-server keeps one process a server between calls (its warmup's is stopped): 1, 2, 3, not 1, 1, 1
    both = on_both(native_tools, smollm2_path, _count_script, "-c", "512", "--mcp-servers-json",
                   _counter_config(tmp_path))
    theirs, ours = both["theirs"], both["ours"]
    assert [body for _, body in theirs["kept"]] == [{"plain_text_response": n} for n in ("1", "2", "3")]
    assert theirs["left"] == (200, ["error"])
    assert [body for _, body in theirs["after"]] == [{"plain_text_response": n} for n in ("1", "2")]
    assert ours == theirs


def _stop_during_call(cmd: list[str], port: int, name: str, started: Path) -> tuple[float, object]:
    """Start `cmd` (a server on `port`), run counter_wait (60 s) and SIGTERM the server while the tool runs: the
    seconds it took to exit, and what the call got."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    got: list[object] = []
    try:
        wait_healthy(proc, port, name)
        call = threading.Thread(target=lambda: got.append(_call_or_error(port)), daemon=True)
        call.start()
        deadline = time.monotonic() + 60
        while not (started.exists() and started.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), f"{name}: the tool did not start"
        began = time.monotonic()
        proc.terminate()
        proc.wait(timeout=30)
        took = time.monotonic() - began
        call.join(timeout=10)
        return took, got[0] if got else None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _call_or_error(port: int) -> object:
    try:
        return post_status(port, "/tools", {"tool": "counter_wait", "params": {"seconds": 60}}, timeout=90)
    except OSError as exc:  # llama-server may close the connection unanswered
        return type(exc).__name__


def test_mcp_tool_call_running_ends_at_the_first_signal(native_tools, smollm2_path, tmp_path):
    # the pin's test_mcp_slow_tool_call_slot_release: the server leaves within 3 s while a tool call runs (serve
    # waited out --shutdown-timeout, 5 s, and then the tool)
    config = ["-c", "512", "--mcp-servers-json"]
    port = free_port()
    theirs_started = tmp_path / "theirs"
    theirs = _stop_during_call([str(native_tools / "llama-server"), "-m", str(smollm2_path), "--host", "127.0.0.1",
                                "--port", str(port), "-t", str(THREADS), "-np", "1", "--jinja", *config,
                                _counter_config(tmp_path, str(theirs_started))], port, "llama-server",
                               theirs_started)
    port = free_port()
    ours_started = tmp_path / "ours"
    ours = _stop_during_call([sys.executable, "-m", "llamaplug.cli", "serve", "-m", str(smollm2_path), "--host",
                              "127.0.0.1", "--port", str(port), "-t", str(THREADS), *config,
                              _counter_config(tmp_path, str(ours_started))], port, "llamaplug serve", ours_started)
    # the pin asks 3 s; 4 leaves a loaded CI machine room, and the old grace (5 s, then the tool) still fails
    assert theirs[0] < 4, theirs
    assert ours[0] < 4, ours
    # serve answers the call its API's error for a server shutting down
    assert isinstance(ours[1], tuple) and ours[1][0] == 503, ours
