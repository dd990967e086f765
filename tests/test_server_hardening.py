"""Issue 43, parts 5-8: `llamaplug serve` hardened where QA found it (and often the pin's llama-server) open.

Each test first shows the finding where the pin's llama-server has it too (the same requests to it), then
llamaplug's answer:
5. a `*.gguf` that is no GGUF in --models-dir is skipped with one warning; no error shows a server path or
   the bytes of a file;
6. /completion and /v1/completions honour max_tokens (and max_completion_tokens, n_predict) in llama-server's
   order of precedence;
7. a slot file is opened without following a symbolic link planted in the slot folder;
8. without --api-key, browser requests come from loopback pages only and a loopback connection's Host names a
   loopback host (DNS rebinding); with a key, CORS is llama-server's; /api/copy's aliases are plain names.
"""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llamaplug_testing import llama_server, llamaplug_server

CTX = "512"
PROMPT = "Once upon a time"


def call(port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, str], Any]:
    """(status, headers in lower case, the JSON body or None) of one request; a `Host` in `headers` is sent as it
    is (http.client then adds none)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        raw = resp.read()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, parsed
    finally:
        conn.close()


@pytest.fixture(scope="module")
def slot_dirs(tmp_path_factory) -> dict[str, Path]:
    return {who: tmp_path_factory.mktemp(f"slots-{who}") for who in ("theirs", "ours")}


@pytest.fixture(scope="module")
def theirs(native_tools, smollm2_path, slot_dirs) -> Iterator[int]:
    """The pin's llama-server, no --api-key (its --slot-save-path wants the final separator)."""
    with llama_server(native_tools, smollm2_path, "-c", CTX, "--slot-save-path", f"{slot_dirs['theirs']}/") as port:
        yield port


@pytest.fixture(scope="module")
def ours(smollm2_path, slot_dirs) -> Iterator[int]:
    """`llamaplug serve` with the same flags."""
    with llamaplug_server(smollm2_path, "-np", "1", "-c", CTX, "--slot-save-path", str(slot_dirs["ours"]),
                          "--spec-type", "none") as (port, _):
        yield port


# -- 5. a file in --models-dir that is not GGUF ---------------------------------------------------------------
def test_a_models_dir_skips_a_file_that_is_not_gguf(tmp_path, smollm2_path):
    """QA: one non-GGUF file made /api/tags a 500 for the whole list, and chat without `model` (the junk file
    sorted first, so it was the default model) a 500 showing the absolute path and the file's first bytes."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "aaa-notes.gguf").write_text("SECRET-BYTES: not a model\n")  # sorted first: the default model
    (folder / smollm2_path.name).symlink_to(smollm2_path)
    (folder / "beta.gguf").symlink_to(smollm2_path)
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
    with llamaplug_server(None, "--models-dir", str(folder), "--parallel", "1", "-c", CTX) as (port, proc):
        status, _, tags = call(port, "GET", "/api/tags")
        assert status == 200, tags
        assert sorted(m["name"] for m in tags["models"]) == [f"{smollm2_path.stem}:latest", "beta:latest"]
        status, _, reply = call(port, "POST", "/v1/chat/completions", chat)  # no `model`: the default one
        assert status == 200 and reply["model"] == smollm2_path.stem, reply

        # A served file that stops being GGUF while serving: the list keeps the others, and a load of it is a
        # 500 that names the model, never the folder or what the file holds.
        (folder / "beta.gguf").unlink()
        (folder / "beta.gguf").write_text("SECRET-BYTES: replaced\n")
        status, _, tags = call(port, "GET", "/api/tags")
        assert status == 200 and [m["name"] for m in tags["models"]] == [f"{smollm2_path.stem}:latest"], tags
        for path, body in (("/v1/chat/completions", {**chat, "model": "beta.gguf"}),
                           ("/api/show", {"model": "beta.gguf"})):
            status, _, error = call(port, "POST", path, body)
            text = json.dumps(error)
            assert status == 500 and "beta.gguf" in text, (path, error)
            assert str(tmp_path) not in text and "SECRET" not in text and "magic" not in text, (path, error)
    warnings = [line for line in proc.stderr.read().splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "aaa-notes.gguf" in warnings[0] and "not GGUF" in warnings[0], warnings


# -- 6. max_tokens on /completion and /v1/completions ---------------------------------------------------------
LIMITS = [  # (route, the request's limit fields, the tokens llama-server generates: its precedence)
    ("/completion", {"max_tokens": 3}, 3),
    ("/completion", {"max_completion_tokens": 4, "max_tokens": 9}, 4),
    ("/completion", {"n_predict": 2, "max_completion_tokens": 4, "max_tokens": 9}, 2),
    ("/v1/completions", {"max_tokens": 3}, 3),
    ("/v1/completions", {"max_completion_tokens": 4, "max_tokens": 9}, 4),
    ("/v1/completions", {"n_predict": 2, "max_tokens": 9}, 2),
]


def _generated(port: int, route: str, limits: dict[str, int]) -> int:
    status, _, out = call(port, "POST", route, {"prompt": PROMPT, "temperature": 0, **limits})
    assert status == 200, out
    return out["tokens_predicted"] if route == "/completion" else out["usage"]["completion_tokens"]


def test_max_tokens_limits_completions_as_llama_server(theirs, ours):
    """QA: /completion {"prompt": ..., "max_tokens": 3} generated 120 tokens, llama-server 3. llama-server reads
    n_predict, else max_completion_tokens, else max_tokens (server-schema.cpp: n_predict's aliases), on both routes
    (its /v1/completions copies n_predict over max_tokens)."""
    seen = {who: [_generated(port, route, limits) for route, limits, _ in LIMITS]
            for who, port in (("theirs", theirs), ("ours", ours))}
    assert seen["theirs"] == [n for _, _, n in LIMITS], seen
    assert seen["ours"] == seen["theirs"], seen


# -- 7. a symbolic link planted in the slot folder ------------------------------------------------------------
def _save(port: int, name: str, action: str = "save") -> tuple[int, Any]:
    status, _, out = call(port, "POST", f"/slots/0?action={action}", {"filename": name})
    return status, out


def test_slot_save_does_not_follow_a_planted_symlink(theirs, ours, slot_dirs, tmp_path):
    """QA: a slot save follows a symbolic link planted in the slot folder and overwrites its target (llama-server
    too, shown first). Here the link is refused (400), its target untouched, and a restore does not read through
    one either; a hard link to a file elsewhere is refused too; a plain file saves and restores as before."""
    for who, port in (("theirs", theirs), ("ours", ours)):
        assert call(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 2})[0] == 200  # a slot to save
        target = tmp_path / f"{who}-target.txt"
        target.write_text("canary")
        (slot_dirs[who] / "planted.bin").symlink_to(target)
        status, out = _save(port, "planted.bin")
        if who == "theirs":  # the finding, in llama-server
            assert status == 200 and target.read_bytes() != b"canary", out
            continue
        assert status == 400 and "symbolic link" in json.dumps(out), out
        assert target.read_text() == "canary" and (slot_dirs[who] / "planted.bin").is_symlink()
        status, out = _save(port, "planted.bin", "restore")
        assert status == 400 and "symbolic link" in json.dumps(out), out
        os.link(target, slot_dirs[who] / "hard.bin")
        status, out = _save(port, "hard.bin")
        assert status == 400 and target.read_text() == "canary", out
        status, out = _save(port, "plain.bin")
        assert status == 200 and out["n_saved"] > 0 and (slot_dirs[who] / "plain.bin").stat().st_size == \
            out["n_written"], out
        status, out = _save(port, "plain.bin", "restore")
        assert status == 200 and out["n_read"] == (slot_dirs[who] / "plain.bin").stat().st_size, out
        assert _save(port, "missing.bin", "restore")[0] == 400


# -- 8. CORS and the Host header without --api-key ------------------------------------------------------------
EVIL = "http://evil.example"
FORM = {"Content-Type": "text/plain"}  # a "simple" request: a browser sends it cross-origin with no preflight


def test_without_a_key_other_origins_and_hosts_are_refused(theirs, ours, smollm2_path):
    """QA: both servers reflect any Origin (`null` too) with credentials and check no Host, so any page could
    drive the API (a text/plain POST to /models/unload and /api/copy from another origin worked) and DNS
    rebinding reached it. llama-server shown first; then llamaplug: 403s, and nothing done."""
    completion = json.dumps({"prompt": PROMPT, "n_predict": 1}).encode()
    for origin in (EVIL, "null"):
        status, headers, _ = call(theirs, "POST", "/completion", completion, {**FORM, "Origin": origin})
        assert status == 200 and headers["access-control-allow-origin"] == origin, headers
        assert headers.get("access-control-allow-credentials", "true") == "true"
    port = theirs
    assert call(port, "POST", "/completion", completion, {"Host": f"evil.example:{port}"})[0] == 200

    model = smollm2_path.name
    for origin in (EVIL, "null"):
        for path, body in (("/models/unload", {"model": model}), ("/api/copy", {"source": model,
                                                                                  "destination": "stolen"}),
                           ("/completion", {"prompt": PROMPT, "n_predict": 1})):
            status, headers, error = call(ours, "POST", path, json.dumps(body).encode(), {**FORM, "Origin": origin})
            assert status == 403 and "access-control-allow-origin" not in headers, (origin, path, error)
            assert "origin" in json.dumps(error).lower(), error
        status, headers, _ = call(ours, "OPTIONS", "/completion", None, {"Origin": origin,
                                                                        "Access-Control-Request-Method": "POST"})
        assert status == 403 and "access-control-allow-origin" not in headers
    for host in (f"evil.example:{ours}", "attacker.test", f"127.0.0.1.nip.io:{ours}"):  # DNS rebinding's names
        status, _, error = call(ours, "POST", "/completion", completion, {"Host": host})
        assert status == 403 and error["error"]["type"] == "permission_error" and "Host" in error["error"]["message"]
        # (the page's own origin goes with such a Host: same-origin does not let it in)
        status, _, _ = call(ours, "POST", "/completion", completion, {"Host": host, "Origin": f"http://{host}"})
        assert status == 403
    assert call(ours, "GET", "/v1/models")[2]["data"][0]["status"]["value"] == "loaded"  # the unload never ran
    assert "stolen:latest" not in [m["name"] for m in call(ours, "GET", "/api/tags")[2]["models"]]

    # What is let in: clients without an Origin, loopback pages (with CORS headers), the server's own page.
    assert call(ours, "POST", "/completion", completion, FORM)[0] == 200
    for host in (f"localhost:{ours}", f"[::1]:{ours}", "127.0.0.2", f"app.localhost:{ours}"):
        assert call(ours, "POST", "/completion", completion, {"Host": host})[0] == 200, host
    for origin in ("http://localhost:5173", "http://127.0.0.1:3000", f"http://127.0.0.1:{ours}", "http://[::1]:8000"):
        status, headers, _ = call(ours, "POST", "/completion", completion, {**FORM, "Origin": origin})
        assert status == 200 and headers["access-control-allow-origin"] == origin, (origin, headers)
        status, headers, _ = call(ours, "OPTIONS", "/completion", None, {"Origin": origin,
                                                                        "Access-Control-Request-Method": "POST"})
        assert status == 200 and headers["access-control-allow-origin"] == origin


def test_cors_origins_opens_it_to_the_origins_listed(smollm2_path):
    """--cors-origins lets the listed origin's pages in, and its host name in Host (a reverse proxy forwarding
    it); other origins stay refused; "*" is llama-server's behaviour, any origin and Host."""
    completion = json.dumps({"prompt": PROMPT, "n_predict": 1}).encode()
    app = "https://app.example"
    with llamaplug_server(smollm2_path, "-np", "1", "-c", CTX, "--cors-origins", app) as (port, _):
        status, headers, _ = call(port, "POST", "/completion", completion, {**FORM, "Origin": app})
        assert status == 200 and headers["access-control-allow-origin"] == app
        assert call(port, "POST", "/completion", completion, {"Host": "app.example"})[0] == 200
        assert call(port, "POST", "/completion", completion, {**FORM, "Origin": EVIL})[0] == 403
        assert call(port, "POST", "/completion", completion, {"Host": "evil.example"})[0] == 403
    with llamaplug_server(smollm2_path, "-np", "1", "-c", CTX, "--cors-origins", "*") as (port, _):
        status, headers, _ = call(port, "POST", "/completion", completion,
                                  {**FORM, "Origin": EVIL, "Host": "evil.example"})
        assert status == 200 and headers["access-control-allow-origin"] == EVIL


def test_with_a_key_cors_is_llama_servers(theirs, smollm2_path):
    """With --api-key: an OPTIONS preflight from any origin gets llama-server's Access-Control-Allow-* headers
    (llama-server's CORS does not depend on its key: compared with the keyless one), and a keyed request from
    any origin and Host is answered, with the origin reflected."""
    preflight = {"Origin": EVIL, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    names = ("access-control-allow-origin", "access-control-allow-credentials", "access-control-allow-methods",
             "access-control-allow-headers")
    status, headers, _ = call(theirs, "OPTIONS", "/v1/chat/completions", None, preflight)
    expected = (status, {n: headers.get(n) for n in names})
    with llamaplug_server(smollm2_path, "-np", "1", "-c", CTX, "--api-key", "k") as (port, _):
        status, headers, _ = call(port, "OPTIONS", "/v1/chat/completions", None, preflight)
        assert (status, {n: headers.get(n) for n in names}) == expected
        status, headers, _ = call(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 1},
                                  {"Origin": EVIL, "Host": "evil.example", "Authorization": "Bearer k"})
        assert status == 200 and headers["access-control-allow-origin"] == EVIL
        assert call(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 1}, {"Origin": EVIL})[0] == 401


def _raw_names(port: int, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> list[str]:
    """The response's header names as they came over the wire (the body read to its end)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return [name for name, _ in resp.getheaders()]
    finally:
        conn.close()


def test_header_names_are_spelled_as_llama_servers(theirs, ours):
    """Issue 48 part 6: llama-server's own tests copy a response's headers into a plain dict and look for
    `Access-Control-Allow-Origin`; uvicorn wrote every name in lower case. Each name both servers send, on a
    JSON answer, a preflight, an error and an SSE stream, now has llama-server's spelling (failed before:
    `access-control-allow-origin`, `content-type`)."""
    origin = {"Origin": "http://localhost:5173"}
    asks = [("GET", "/health", None, origin),
            ("OPTIONS", "/completion", None, {**origin, "Access-Control-Request-Method": "POST"}),
            ("POST", "/completion", b"{", {**origin, "Content-Type": "application/json"}),
            ("POST", "/completion", json.dumps({"prompt": PROMPT, "n_predict": 2, "stream": True}).encode(),
             {**origin, "Content-Type": "application/json"})]
    for ask in asks:
        expected = {n.lower(): n for n in _raw_names(theirs, *ask)}
        got = {n.lower(): n for n in _raw_names(ours, *ask)}
        shared = expected.keys() & got.keys()
        assert {"access-control-allow-origin", "content-type"} <= shared or ask[0] == "OPTIONS", (ask, got)
        assert {n: got[n] for n in shared} == {n: expected[n] for n in shared}, ask[:2]


def test_cors_proxy_is_llama_servers(theirs, ours, smollm2_path):
    """Issue 48 part 6: llama-server's --ui-mcp-proxy (GET/POST /cors-proxy?url=...): 403 without the flag, as
    the pin's llama-server answers; with it, only the headers the page names x-llama-server-proxy-header-* go
    to the target (the page's key and cookies never leave), a POST's body goes as it came, the target's status
    (a 204 too), type and body come back; a URL the proxy may not ask is a 400 naming it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Target(BaseHTTPRequestHandler):
        def do_GET(self):
            self.server.seen.append((dict(self.headers), b""))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"ok": true}')

        def do_POST(self):
            self.server.seen.append((dict(self.headers), self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_):
            pass

    assert call(theirs, "GET", "/cors-proxy")[0] == call(ours, "GET", "/cors-proxy")[0] == 403
    target = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    target.seen = []
    threading.Thread(target=target.serve_forever, daemon=True).start()
    url = f"/cors-proxy?url=http://127.0.0.1:{target.server_port}/capture"
    try:
        with llamaplug_server(smollm2_path, "-np", "1", "-c", CTX, "--api-key", "k", "--ui-mcp-proxy") as (port, _):
            sent = {"Authorization": "Bearer k", "Cookie": "session=secret", "X-Api-Key": "k",
                    "x-llama-server-proxy-header-accept": "application/json",
                    "x-llama-server-proxy-header-authorization": "Bearer explicit"}
            status, headers, body = call(port, "GET", url, None, sent)
            assert (status, headers["content-type"], body) == (200, "application/json", {"ok": True})
            seen = {k.lower(): v for k, v in target.seen[-1][0].items()}
            assert seen["accept"] == "application/json" and seen["authorization"] == "Bearer explicit"
            assert not {"cookie", "x-api-key", "content-type"} & seen.keys(), seen
            status, _, body = call(port, "POST", url, b'{"jsonrpc": "2.0"}', {"Authorization": "Bearer k"})
            assert (status, body, target.seen[-1][1]) == (204, None, b'{"jsonrpc": "2.0"}')
            for bad in ("file:///etc/passwd", "http://user:pw@127.0.0.1/", "nohost"):
                status, _, error = call(port, "GET", f"/cors-proxy?url={bad}", None, {"Authorization": "Bearer k"})
                assert status == 400 and "target URL" in error["error"]["message"], error
            import socket

            with socket.socket() as free:  # a port nothing listens on: the proxy's 502 (api_error.BadGatewayError)
                free.bind(("127.0.0.1", 0))
                closed = free.getsockname()[1]
            status, _, error = call(port, "GET", f"/cors-proxy?url=http://127.0.0.1:{closed}/", None,
                                    {"Authorization": "Bearer k"})
            assert status == 502 and "could not reach" in error["error"]["message"], error
            assert call(port, "GET", url)[0] == 401  # the key is still asked for
    finally:
        target.shutdown()
        target.server_close()


@pytest.mark.parametrize("alias", ["../canary", "a/b", "a\\b", "a\x00b", "tab\there", "x" * 10_000, " edge", ":latest"],
                         ids=["dotdot", "slash", "backslash", "nul", "control", "10k", "space", "empty"])
def test_api_copy_refuses_a_name_that_is_not_plain(ours, smollm2_path, alias):
    """QA: /api/copy took `../canary`, NUL bytes and 10k-character names as aliases. Each is a 400 naming
    `destination` (Ollama's shape: {"error": ...}), and the name is not served."""
    status, _, error = call(ours, "POST", "/api/copy", {"source": smollm2_path.name, "destination": alias})
    assert status == 400 and error["error"].startswith("destination:"), error
    listed = [m["name"] for m in call(ours, "GET", "/api/tags")[2]["models"]]
    assert alias.removesuffix(":latest") + ":latest" not in listed


def test_api_copy_still_takes_a_plain_name(ours, smollm2_path):
    status, _, _ = call(ours, "POST", "/api/copy", {"source": smollm2_path.name, "destination": "my-model:v1"})
    assert status == 200
    assert "my-model:v1" in [m["name"] for m in call(ours, "GET", "/api/tags")[2]["models"]]
