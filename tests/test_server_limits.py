"""Hostile requests against `llamaplug serve` (issue 36 A): each costs bounded time and memory.

Each probe runs on a fresh server (`--parallel 4 -c 4096 --api-key`, as the review ran it): the request
ends in a 4xx (or a success) within a time limit, /health answers within 0.5 s all the while (polled
every 50 ms from a thread; 0.5 s more than its slowest of 10 polls before the probe, so that a loaded
test machine does not fail it), the server's RSS grows by at most 256 MiB, and it is still up afterwards.
Every loop here is bounded; everything is on loopback.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import psutil
import pytest
from llamaplug_testing.servers import llamaplug_server

KEY = "probe-key"
SERVE = ("--parallel", "4", "-c", "4096", "--api-key", KEY, "--metrics")
HEALTH_S = 0.5
RSS_MIB = 256
MIB = 2**20


class Watch:
    """/health latency and the server's RSS, sampled while a probe runs."""

    def __init__(self, port: int, pid: int):
        self.port, self.process = port, psutil.Process(pid)
        self.base = self.peak = self.process.memory_info().rss
        self.worst, self.polls, self.failures = 0.0, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                status, _, _ = request(self.port, "GET", "/health", key=False, timeout=5)
                if status != 200:
                    self.failures.append(status)
            except OSError as exc:
                self.failures.append(repr(exc))
            self.worst = max(self.worst, time.perf_counter() - started)
            self.polls += 1
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._stop.wait(0.05)

    def more_polls(self, n: int, limit_s: float = 30) -> None:
        """Wait for `n` more /health polls."""
        target, deadline = self.polls + n, time.monotonic() + limit_s
        while self.polls < target:
            assert time.monotonic() < deadline, f"/health was polled {self.polls} times, not {target}, in {limit_s} s"
            time.sleep(0.01)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def request(port: int, method: str, path: str, body: bytes | str | dict | None = None, key: bool = True,
            timeout: float = 120) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request on its own connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {KEY}"
        data = json.dumps(body) if isinstance(body, dict) else body
        try:
            conn.request(method, path, data, headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered (a 413) and closed before the whole body went: its answer is still there
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def raw_exchange(port: int, parts: Iterable[bytes], limit_s: float = 60) -> tuple[int | None, int]:
    """Send `parts` on one connection until the server answers or closes; (the status it answered, bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=limit_s)
    deadline = time.monotonic() + limit_s
    got, sent = b"", 0
    try:
        for part in parts:
            assert time.monotonic() < deadline, f"the server took {sent} bytes and said nothing for {limit_s} s"
            try:
                sock.sendall(part)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(part)
            sock.setblocking(False)
            try:
                got = sock.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                break
            finally:
                sock.setblocking(True)
            break  # an answer (or the end of the connection): stop sending
        sock.settimeout(max(1.0, deadline - time.monotonic()))
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while b"\r\n" not in got:
                more = sock.recv(65536)
                if not more:
                    break
                got += more
    finally:
        sock.close()
    status = int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else None
    return status, sent


def probe(model, send: Callable[[int], object], *serve_args: str, limit_s: float = 120) -> object:
    """Run `send(port)` on a fresh server under watch; what it returns, once the watch's bounds are checked."""
    with llamaplug_server(model, *SERVE, *serve_args) as (port, proc), Watch(port, proc.pid) as watch:
        watch.more_polls(10)
        idle, watch.worst = watch.worst, 0.0  # on a loaded machine /health is slow before any probe: the bound's base
        started = time.monotonic()
        out = send(port)
        took = time.monotonic() - started
        assert took < limit_s, f"the probe took {took:.1f} s"
        watch.more_polls(2)  # /health still answers after the probe
        assert not watch.failures, watch.failures
        assert watch.worst < idle + HEALTH_S, f"/health took {watch.worst:.3f} s in the probe, {idle:.3f} s before"
        grown = (watch.peak - watch.base) / MIB
        assert grown <= RSS_MIB, f"RSS grew {grown:.0f} MiB"
        assert proc.poll() is None and request(port, "GET", "/health", key=False)[0] == 200
    return out


def error_of(body: bytes) -> dict:
    return json.loads(body)["error"]


# -- A3: what a request may send before any route sees it --------------------------------------------

def _header(total: int) -> Iterator[bytes]:
    yield b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
    for _ in range(total // 65536):
        yield b"a" * 65536
    yield b"\r\n\r\n"


def test_a_64_mib_header_is_a_431_before_the_key_is_read(smollm2_path):
    status, sent = probe(smollm2_path, lambda port: raw_exchange(port, _header(64 * MIB)))
    assert status == 431
    assert sent < 16 * MIB  # refused after the cap (64 KiB) and what the socket buffers held, not at the end


def _body(total: int, chunked: bool) -> Iterator[bytes]:
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode()
            + b"\r\nContent-Type: application/json\r\n")
    yield head + (b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"Content-Length: %d\r\n\r\n" % total)
    for _ in range(total // 65536):
        yield b"10000\r\n" + b" " * 65536 + b"\r\n" if chunked else b" " * 65536


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_the_cap_is_a_413(smollm2_path, chunked):
    status, sent = probe(smollm2_path, lambda port: raw_exchange(port, _body(256 * MIB, chunked)),
                         "--max-body-mib", "4")
    assert status == 413
    assert sent < 64 * MIB


def test_the_body_cap_answers_in_the_apis_shape(smollm2_path):
    big = {"prompt": "x" * (2 * MIB), "max_tokens": 1}
    status, headers, body = probe(smollm2_path, lambda port: request(port, "POST", "/v1/completions", big),
                                  "--max-body-mib", "1")
    assert status == 413 and headers.get("connection") == "close"
    assert error_of(body)["param"] == "body" and "--max-body-mib" in error_of(body)["message"]


# -- A4: a long prompt is worked on beside /health, not in its way ------------------------------------

@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/completion", "/tokenize"])
def test_a_long_prompt_does_not_stall_health(smollm2_path, path):
    # 1 MiB, ~175,000 tokens: seconds of tokenizing, in a worker thread. What stays on the event loop (or holds
    # the GIL) grows with the prompt too: parsing the body, and making the token list (~60 ms a million tokens
    # on an idle machine), so at the 8 MiB cap /health waited ~0.4 s; a test machine at load 17 stretches that.
    text = "hello world " * (MIB // 12)
    body = {"/v1/completions": {"prompt": text, "max_tokens": 2}, "/completion": {"prompt": text, "n_predict": 2},
            "/v1/chat/completions": {"messages": [{"role": "user", "content": text}], "max_tokens": 2},
            "/tokenize": {"content": text}}[path]
    data = json.dumps(body)  # here, not in the probe: the watch thread shares this process's GIL
    status, _, answer = probe(smollm2_path, lambda port: request(port, "POST", path, data, timeout=240),
                              limit_s=240)
    if path == "/tokenize":
        assert status == 200 and len(json.loads(answer)["tokens"]) > 4096
    else:
        assert status == 400 and "1024" in error_of(answer)["message"]  # a slot holds 4096 / 4 positions


# -- A5: stop strings ---------------------------------------------------------------------------------

def test_200_stops_of_4000_characters_are_a_400_naming_stop(smollm2_path):
    data = json.dumps({"prompt": "Once upon a time", "max_tokens": 1000,
                       "stop": [f"{i}:" + "z" * 4000 for i in range(200)]})
    status, _, answer = probe(smollm2_path, lambda port: request(port, "POST", "/v1/completions", data))
    assert status == 400 and error_of(answer)["param"] == "stop"


# -- A6: 400s, not 500s; nothing a client may not do ------------------------------------------------------

LONE = "\\ud800"  # JSON's escape of a lone surrogate (written into the body as is)
CHAT = '{"messages": [{"role": "user", "content": "Hi"}], '


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "stop": ["a' + LONE + 'b"]}', "stop.0"),
    ("/apply-template", '{"messages": [{"role": "user", "content": "a' + LONE + '"}]}', None),
    ("/v1/responses", '{"input": "Hi ' + LONE + '", "stream": true, "max_output_tokens": 2}', "input"),
    ("/v1/chat/completions", CHAT + '"repeat_penalty": Infinity}', "body"),
    ("/v1/chat/completions", CHAT + '"temperature": NaN}', "body"),
    ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "top_p": 1e400}', "body"),
    ("/v1/chat/completions", CHAT + '"max_tokens": 1e30}', "max_tokens"),
    ("/v1/completions", '{"prompt": "Hi", "max_tokens": 1e15}', "max_tokens"),
], ids=["stop-surrogate", "apply-template-surrogate", "responses-stream-surrogate", "repeat-penalty-infinity",
        "temperature-nan", "top-p-1e400", "max-tokens-1e30", "max-tokens-1e15"])
def test_what_llama_servers_parser_refuses_is_a_400(smollm2_path, path, raw, param):
    status, headers, answer = probe(smollm2_path, lambda port: request(port, "POST", path, raw))
    assert status == 400, answer[:300]
    error = error_of(answer)
    if path == "/apply-template":  # llama-server's shape: no param, the field in the message
        assert error["code"] == 400 and "messages.0.content" in error["message"]
    else:
        assert error["param"] == param


def test_escaped_emoji_and_nan_in_text_are_still_taken(smollm2_path):
    # The refusals above look for NaN, surrogate escapes and big exponents: the same spellings inside text,
    # and a correct surrogate pair, are fine.
    raw = ('{"messages": [{"role": "user", "content": "NaN, Infinity, e400 and \\ud83d\\ude00"}], "max_tokens": 2,'
           ' "temperature": 1e-400}')
    status, _, answer = probe(smollm2_path, lambda port: request(port, "POST", "/v1/chat/completions", raw))
    assert status == 200, answer[:300]


def test_a_trailing_slash_is_a_404_not_a_redirect_built_from_host(smollm2_path):
    def send(port: int) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/static/chat.js/", headers={"Host": "evil.example"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()

    status, headers, _ = probe(smollm2_path, send)
    assert status == 404 and "location" not in headers


def test_keep_alive_zero_does_not_unload_the_one_model(smollm2_path):
    # Unloaded and loaded again, the model would come back with an empty KV cache: whether the second request
    # found its prompt cached says whether the model stayed (no waiting on a timer).
    body = {"prompt": "The capital of France is a city that", "max_tokens": 2, "keep_alive": 0}

    def send(port: int) -> float:
        for _ in range(2):
            status, _, answer = request(port, "POST", "/v1/completions", body)
            assert status == 200, answer[:300]
        status, _, models = request(port, "GET", "/v1/models")
        assert json.loads(models)["data"][0]["status"]["value"] == "loaded"
        metrics = request(port, "GET", "/metrics")[2].decode()
        return next(float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("llamaplug_cached_tokens_total "))

    assert probe(smollm2_path, send) > 0
