"""`llamaplug serve`'s flags and errors, and its log (issue 48, parts 2 and 5).

Flags: llama-server's meanings (`-a` a comma list, repeatable), every range checked before anything
loads, a busy port found before the model loads, `--no-webui` real, serve's own usage on a bad flag,
an empty API key refused. Log: the "listening on" line once the socket listens, one access line per
request, `--log-format json`, llama.cpp's own lines only with `--verbose`, a line when it stopped.

Parser-level checks run `llamaplug serve` with no model; the server checks share two servers (SmolLM2),
one logging text and one JSON, each stopped by the last test that uses it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from llamaplug_testing import free_port, llama_server

KEY = "s3cret"
THREADS = 1  # a busy machine: see test_first_hour_cli.py


def serve(*args: str, env: dict[str, str] | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamaplug.cli", "serve", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


# -- flags and errors, no model loaded ------------------------------------------------------------------------
@pytest.mark.parametrize("argv, flag", [
    (["--bogus"], "--bogus"),  # argparse's "unrecognized arguments", with serve's usage (was the top level's)
    (["--port", "99999"], "--port"),  # was taken modulo 65536: it listened on 34463
    (["--port", "-1"], "--port"),
    (["--api-key", ""], "--api-key"),  # an empty key turned authentication off
    (["--api-key", "  "], "--api-key"),
    (["--max-queue", "0"], "--max-queue"),  # was found by the registry, while the model loaded
    (["--max-loaded", "0"], "--max-loaded"),
    (["-ub", "0"], "-ub"),
    (["--spec-type", "bogus"], "--spec-type"),  # was exit 1, one line, no usage (issue 48's walk-through)
])
def test_a_bad_flag_is_exit_2_with_serves_usage_naming_it(argv, flag):
    done = serve(*argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("usage: llamaplug serve "), done.stderr[:300]
    assert "llamaplug serve: error: " in done.stderr and flag in done.stderr.splitlines()[-1]


def test_a_ubatch_over_the_batch_is_refused_not_clamped():
    """llama.cpp would silently take -ub down to -b: said instead, before anything loads."""
    done = serve("-ub", "4096", "-b", "1024")
    assert done.returncode == 1 and "-ub 4096 is more than -b 1024" in done.stderr, done.stderr


def test_an_empty_api_key_from_the_environment_is_refused():
    done = serve(env={"LLAMA_API_KEY": ""})
    assert done.returncode == 1 and "LLAMA_API_KEY" in done.stderr and "empty" in done.stderr, done.stderr


@pytest.mark.parametrize("how", [["--offline"], []], ids=["flag", "LLAMA_ARG_OFFLINE"])
def test_offline_takes_a_hub_name_from_the_cache_only(tmp_path, how):
    """llama-server's --offline (the flag its own test suite passes): a name not in the Hub cache fails at once,
    saying so, with no request to the Hub (was: refused as a flag llamaplug does not implement)."""
    env = {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "0", **({} if how else {"LLAMA_ARG_OFFLINE": "1"})}
    done = serve(*how, "-m", "someorg/not-here-GGUF:Q4_0", env=env, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "offline" in done.stderr and "not in the local cache" in done.stderr, done.stderr[-500:]


def test_help_shows_the_host_and_port_defaults():
    done = serve("--help")
    text = " ".join(done.stdout.split())  # argparse wraps the lines
    assert done.returncode == 0
    assert "--host HOST address to listen on" in text and "(default: 127.0.0.1)" in text
    assert "--port PORT port to listen on, 0 for any free one (default: 8080)" in text
    assert "requests decoded together (default: 4)" in text and "shared by the slots (default: 8192)" in text
    assert "no-op: there is no web UI" not in text and "--no-webui" in text


def test_alias_is_llama_servers_comma_list_and_repeatable():
    from llamaplug.cli import parser

    # -a was a plain store: `-a foo` gave "foo", taken as three aliases (one per character) for one -m
    assert parser().parse_args(["serve", "-a", "foo"]).alias == ["foo"]
    assert parser().parse_args(["serve", "-a", "foo,bar", "--alias", "baz"]).alias == ["foo,bar", "baz"]


def test_a_busy_port_is_refused_before_the_model_loads(smollm2_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        done = serve("-m", str(smollm2_path), "--port", str(port), "-t", str(THREADS))
        refused_in = time.monotonic() - start
    assert done.returncode == 1, done.stderr
    assert f"--port {port}: cannot listen there" in done.stderr
    assert "loaded" not in done.stderr  # the model was never loaded (the line a load ends with)
    print(f"busy port refused in {refused_in:.2f} s")


def test_port_0_with_several_tcp_addresses_is_refused():
    done = serve("--host", "127.0.0.1,localhost", "--port", "0")
    assert done.returncode == 1 and "--port 0" in done.stderr, done.stderr


# -- the servers ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def started(*args: str) -> Iterator[SimpleNamespace]:
    """`llamaplug serve` on a free port, yielded once its "listening on" line is out (its stderr read whole,
    line by line, by a thread); `health`: what /health answered right after that line, without a retry."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llamaplug.cli", "serve", "--port", str(port), "-t",
                             str(THREADS), "-np", "1", "-c", "512", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    listening = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if "listening on" in line:
                listening.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not listening.wait(120):
            pytest.fail(f"no listening line: {lines[-20:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
                health = resp.status
        except OSError as exc:
            health = repr(exc)
        yield SimpleNamespace(port=port, proc=proc, lines=lines, reader=reader, health=health)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def stop(server: SimpleNamespace) -> list[str]:
    """Stop `server` with SIGTERM; every line it wrote."""
    server.proc.terminate()
    server.proc.wait(timeout=30)
    server.reader.join(10)
    return server.lines


def get(port: int, path: str, key: str | None = None) -> tuple[int, str, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers),
                                    timeout=60) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def post(port: int, path: str, body: dict, key: str | None = None) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()
        return resp.status


def reply(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def access_lines(lines: list[str], until: int, timeout: float = 10) -> list[str]:
    """The access log's lines, once there are `until` of them (they are written by a thread of their own)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in lines if line.startswith("llamaplug.server.access: ")]
        if len(found) >= until or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.fixture(scope="module")
def text_server(smollm2_path):
    """Text log at --log info without --verbose; a key; -a twice; --no-webui."""
    with started("-m", str(smollm2_path), "--api-key", KEY, "-a", "smol,tiny", "-a", "baz", "--no-webui",
                 "--log", "info") as server:
        yield server


def test_the_listening_line_comes_once_the_socket_listens(text_server):
    assert text_server.health == 200  # /health answered at once, right after the line
    lines = text_server.lines
    listening = [i for i, line in enumerate(lines) if "listening on" in line]
    loaded = [i for i, line in enumerate(lines) if line.startswith("llamaplug.serve: loaded ")]
    assert len(listening) == 1 and loaded and loaded[0] < listening[0], lines
    assert lines[listening[0]] == (f"llamaplug.serve: listening on http://127.0.0.1:{text_server.port} "
                                   "(API key required)")


def test_alias_flags_name_the_one_model(text_server):
    status, _, body = get(text_server.port, "/v1/models", KEY)
    assert status == 200
    model = json.loads(body)["data"][0]
    assert model["id"] == "baz" and set(model["aliases"]) >= {"baz", "smol", "tiny"}, model


def test_no_webui_serves_no_page(text_server):
    ours = [get(text_server.port, path) for path in ("/", "/static/index.html", "/favicon.ico")]
    assert all(status == 404 for status, _, _ in ours), ours  # / served the page with --no-webui
    assert all("<html" not in body.lower() for _, _, body in ours)
    assert get(text_server.port, "/v1/models", KEY)[0] == 200  # the API is unchanged


def test_llama_server_no_webui_answers_404_at_root(native_tools, smollm2_path):
    """The reference for the test above: the pin's llama-server with --no-webui."""
    with llama_server(native_tools, smollm2_path, "--no-webui", "-c", "512") as port:
        assert get(port, "/")[0] == 404


def test_an_access_line_per_request(text_server):
    port = text_server.port
    before = len(access_lines(text_server.lines, 0))
    get(port, "/v1/models", KEY)
    get(port, "/v1/models")  # no key: 401
    post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, KEY)
    post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                        "stream": True}, KEY)
    get(port, "/health")  # a probe: at debug only, as llama-server leaves it out
    time.sleep(0.5)  # (a line of the probe's would be written by now)
    # the last four: an earlier test's last line may have been written after `before` was counted
    lines = access_lines(text_server.lines, before + 4)[-4:]
    want = [("GET", "/v1/models", "200"), ("GET", "/v1/models", "401"), ("POST", "/v1/chat/completions", "200"),
            ("POST", "/v1/chat/completions", "200")]
    for line, (method, path, status) in zip(lines, want):
        words = line.split()
        assert words[1:4] == [method, path, status] and words[5] == "ms" and words[6] == "127.0.0.1", line
        assert float(words[4]) >= 0


def test_log_info_without_verbose_has_no_native_lines(text_server):
    assert not [line for line in text_server.lines if line.startswith("llamaplug.native")], text_server.lines[:20]


def test_text_server_says_when_it_stopped(text_server):
    lines = stop(text_server)
    assert lines[-1].startswith("llamaplug.serve: stopped after ") and "requests served" in lines[-1], lines[-5:]


@pytest.fixture(scope="module")
def json_server(smollm2_path, tmp_path_factory):
    """JSON lines at --log info with --verbose (llama.cpp's own lines too); no key; -ub 64 and --cache-exact.
    The model from a models dir of one (loaded at start), whose models.toml gives it 2 slots in 1024 tokens
    (the command line's -np 1 -c 512 are the others')."""
    folder = tmp_path_factory.mktemp("one")
    (folder / "smol.gguf").symlink_to(smollm2_path)
    (folder / "models.toml").write_text('["smol.gguf"]\nn_seq_max = 2\nn_ctx = 1024\n')
    with started("--models-dir", str(folder), "--log-format", "json", "--log", "info", "--verbose", "-ub", "64",
                 "--cache-exact") as server:
        yield server


def test_json_lines_parse_as_json(json_server):
    assert json_server.health == 200
    # --verbose is also llama-server's debug default: each reply carries __verbose unless the request says not
    asked = {"prompt": "Hi", "max_tokens": 2}
    assert "__verbose" in reply(json_server.port, "/v1/completions", asked)
    assert "__verbose" not in reply(json_server.port, "/v1/completions", {**asked, "verbose": False})
    chat = reply(json_server.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                            "max_tokens": 2})
    assert chat["__verbose"]["prompt"].endswith("<|im_start|>assistant\n")  # the prompt as rendered
    deadline = time.monotonic() + 10
    while sum('"llamaplug.server.access"' in line for line in json_server.lines) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = stop(json_server)
    records = [json.loads(line) for line in lines]  # every line, llama.cpp's and uvicorn's too
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    listening = [r for r in records if r["message"].startswith("listening on")]
    assert listening == [{**listening[0], "address": f"http://127.0.0.1:{json_server.port}", "auth": False}]
    # models.toml's slots and context, as /slots has them (the line said -np's 1 slots)
    loaded = [r["message"] for r in records if r["message"].startswith("loaded ")]
    assert len(loaded) == 1 and loaded[0].endswith("smol.gguf: 2 slots of 512 tokens"), loaded
    assert "no API key" in listening[0]["message"]
    access = [r for r in records if r["logger"] == "llamaplug.server.access"]
    assert len(access) == 3 and access[0]["method"] == "POST" and access[0]["path"] == "/v1/completions"
    assert access[0]["status"] == 200 and access[0]["duration_ms"] > 0 and access[0]["client"] == "127.0.0.1"
    # --verbose: llama.cpp's own lines (the load's) come through, as JSON too
    assert sum(r["logger"] == "llamaplug.native" for r in records) > 20
    ubatch = [r["message"] for r in records if r["logger"] == "llamaplug.native" and "n_ubatch" in r["message"]]
    assert ubatch and all(m.split("=")[-1].strip() == "64" for m in ubatch), ubatch  # -ub reached the context
    stopped = [r for r in records if r["message"].startswith("stopped after ")]
    assert len(stopped) == 1 and stopped[0]["requests"] >= 2 and stopped[0]["uptime_s"] > 0
    assert records.index(stopped[0]) > records.index(access[0])  # (uvicorn's own last line may follow it)


def test_log_warning_wins_over_verbose_for_uvicorns_lines(smollm2_path, tmp_path):
    """--log warning -v: uvicorn's info lines (started, startup/shutdown complete) stay out, as the library's do
    (they came: -v set uvicorn's level to info whatever --log said). A models dir of two: nothing loads."""
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).symlink_to(smollm2_path)
    with started("--models-dir", str(tmp_path), "--log", "warning", "-v") as server:
        lines = stop(server)
    assert any(line.startswith("llamaplug.serve: stopped after ") for line in lines), lines
    assert not [line for line in lines if line.startswith("uvicorn")], lines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_the_model_loads_ends_with_the_stopped_line(tmp_path, sig):
    """A signal while -m's model loads: the "stopped" line, exit 0, at once, as a signal while serving (it was
    exit 143 / 130 with no line). The model is a FIFO: its load waits in open() until the test opens the other end,
    and then reads nothing (a model on a slow disk)."""
    fifo = tmp_path / "slow.gguf"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-m", "llamaplug.cli", "serve", "-m", str(fifo), "--port",
                             str(free_port()), "--log", "info"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    writer = None
    try:
        deadline = time.monotonic() + 60
        while writer is None and proc.poll() is None and time.monotonic() < deadline:
            try:  # succeeds once the load has opened the file to read it
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.05)
        assert writer is not None, proc.poll()
        time.sleep(0.5)  # (the load started right before serve set its handlers)
        start = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - start
    finally:
        if writer is not None:
            os.close(writer)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = err.splitlines()
    assert proc.returncode == 0 and lines[-1].startswith("llamaplug.serve: stopped after "), lines[-5:]
    assert "0 requests served" in lines[-1] and "Traceback" not in err and took < 10, (took, lines[-5:])


def test_a_stderr_nobody_reads_stalls_no_request(smollm2_path, tmp_path):
    """The access lines fill a pipe nobody reads (64 KiB): the requests go on
    (the lines are written by a thread of their own), and the server still stops at once. A models dir: no
    load (/v1/models loads nothing)."""
    for name in ("a.gguf", "b.gguf"):  # two: neither is loaded at start
        (tmp_path / name).symlink_to(smollm2_path)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llamaplug.cli", "serve", "--models-dir", str(tmp_path),
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while get_or_none(port) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        for _ in range(150):  # ~1 KB lines: 150 KB. Each would wait forever if the event loop wrote its line
            assert get(port, "/v1/models/" + "x" * 1000)[0] == 404
        start = time.monotonic()
        proc.terminate()
        proc.wait(timeout=30)
        assert time.monotonic() - start < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    written = proc.stderr.read()  # what the pipe held: it was full (the rest waited, and was left at exit)
    assert 30_000 < len(written) < 150 * 1000 and b"llamaplug.server.access: GET /v1/models/xxx" in written


def get_or_none(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return resp.status
    except OSError:
        return None
