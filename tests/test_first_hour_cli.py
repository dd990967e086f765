"""The first hour on the command line (issue 35): `serve` as a llama-server user starts it, `chat`, `inspect`,
`bench` and `info` as a new user reads them.

The server is driven by the real `openai` client; its replies are checked against the
library's own calls on the same model (greedy, or the same seed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request

import openai
import pytest
from llamaplug_testing import Terminal, llamaplug_server
from llamaplug_testing.isolation import serve_logging_put_back

import llamaplug as lp

ASK = [{"role": "user", "content": "Name three fruits."}]
# One thread each: these tests run beside others on a small machine, where two threads per process wait
# for each other at every step of a token (8 tokens: 3-10 s with one thread, 50-85 s with two, measured at a
# load of 16 on 2 cores; see "Threads on a busy machine" in docs/getting-started.md).
THREADS = 1


def cli(*args: str, stdin: str | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamaplug.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def models_dir(smollm2_path, tmp_path_factory):
    """Two names for SmolLM2, so that a model id must be resolved (with one model any name gets it)."""
    folder = tmp_path_factory.mktemp("models")
    for name in ("alpha.gguf", "beta.gguf"):
        (folder / name).symlink_to(smollm2_path)
    (folder / "models.toml").write_text('["alpha.gguf"]\nn_ctx = 1024\naliases = ["small"]\n\n'
                                        '["beta.gguf"]\nn_ctx = 1024\n')
    return folder


@pytest.fixture(scope="module")
def served(models_dir):
    """`serve` with llama-server's flags: -fa, --temp 0 for requests that give none, --log info (access log)."""
    with llamaplug_server(None, "--models-dir", str(models_dir), "-fa", "on", "--temp", "0", "--log", "info",
                          "-np", "1", "-t", str(THREADS)) as (port, proc):
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # never a full pipe
        reader.start()
        yield port, lines


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{served[0]}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def local(smollm2_path):
    with lp.Llama.load(smollm2_path, n_ctx=1024, n_threads=THREADS) as llama:
        yield llama


def test_ids_without_gguf_and_aliases_are_echoed(client, local):
    want = local.create_chat_completion(ASK, max_tokens=8).choices[0].message.content
    for name in ("alpha", "small", "alpha.gguf"):
        got = client.chat.completions.create(model=name, messages=ASK, max_tokens=8)
        assert got.model == name and got.choices[0].message.content == want
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gamma", messages=ASK, max_tokens=2)


def test_temp_flag_is_the_default_of_requests(client, local):
    # --temp 0: requests without a temperature are greedy, whatever their seed; one that gives one samples.
    want = local.create_chat_completion(ASK, max_tokens=16).choices[0].message.content
    for seed in (1, 2):
        got = client.chat.completions.create(model="alpha", messages=ASK, max_tokens=16, seed=seed)
        assert got.choices[0].message.content == want
    # A request's own temperature wins: sampled, its seed decides the text.
    hot = {client.chat.completions.create(model="alpha", messages=ASK, max_tokens=16, seed=seed,
                                          temperature=1.5).choices[0].message.content for seed in (3, 4)}
    assert len(hot) == 2 and want not in hot


def test_stream_options_include_usage(client):
    whole = client.chat.completions.create(model="alpha", messages=ASK, max_tokens=8)
    chunks = list(client.chat.completions.create(model="alpha", messages=ASK, max_tokens=8, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == whole.choices[0].message.content
    plain = list(client.chat.completions.create(model="alpha", messages=ASK, max_tokens=8, stream=True))
    assert all(c.usage is None for c in plain)
    text = list(client.completions.create(model="alpha", prompt="Hello", max_tokens=5, stream=True,
                                          stream_options={"include_usage": True}))
    assert text[-1].choices == [] and text[-1].usage.completion_tokens == 5


def test_favicon_and_the_access_log(served):
    port, lines = served
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/favicon.ico", timeout=10) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("image/svg+xml")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as resp:
        assert resp.status == 200
    deadline = __import__("time").monotonic() + 10
    while not any("GET /v1/models" in line for line in lines) and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.2)
    assert any("GET /v1/models" in line and "200" in line for line in lines), lines[-20:]


def test_serve_refuses_a_bad_default_before_loading():
    done = cli("serve", "--temp", "hot")
    assert done.returncode != 0 and "--temp" in done.stderr


def test_chat_reads_turns_and_commands_from_stdin(smollm2_path, local):
    # Greedy: the replies are the library's for the same conversation.
    first = local.create_chat_completion(ASK, max_tokens=8).choices[0].message.content
    history = [*ASK, {"role": "assistant", "content": first}, {"role": "user", "content": "And three more."}]
    second = local.create_chat_completion(history, max_tokens=8).choices[0].message.content
    turns = "Name three fruits.\nAnd three more.\n/help\n/clear\nName three fruits.\n/bye\nnever read\n"
    done = cli("chat", str(smollm2_path), "--temp", "0", "-n", "8", "-c", "1024", "-t", str(THREADS), stdin=turns)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.count(first) == 2 and second in out
    assert out.index(first) < out.index(second) < out.index("/bye") < out.rindex(first)
    assert "never read" not in out


def test_chat_in_a_terminal_prompts_and_leaves_on_ctrl_d(smollm2_path):
    import pty
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the child: the chat on the pty
        os.execv(sys.executable, [sys.executable, "-m", "llamaplug.cli", "chat", str(smollm2_path), "--temp", "0",
                                  "-n", "4", "-c", "512", "-t", str(THREADS)])
    term = Terminal(fd)
    try:
        term.until(b">>> ")
        os.write(fd, b"Hi\n")
        # The reply's end is the second prompt (a Ctrl-D sent while the reply streams can be lost when the line
        # editor takes the terminal back)
        term.until(b">>> ", count=2)
        os.write(fd, b"\x04")  # Ctrl-D
        end = time.monotonic() + 60
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > end:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise AssertionError(f"the chat did not leave on Ctrl-D: {term.seen[-500:]!r}")
            time.sleep(0.1)
        status = done[1]
    finally:
        os.close(fd)
    assert b"/help for commands" in term.seen and os.waitstatus_to_exitcode(status) == 0


def test_chat_reasoning_is_dimmed_and_history_kept():
    """Pure-Python parts of the REPL, with a stand-in for the model: the thinking streamed apart
    (delta.reasoning_content, as the chat layer streams it), then the answer."""
    import io

    from llamaplug.chat_repl import DIM, RESET, repl
    from llamaplug.high.chat import ChatCompletionChunk, ChunkChoice, Delta

    seen: list[list[dict]] = []

    class Model:
        params = type("P", (), {"model_path": __import__("pathlib").Path("m.gguf")})

        def create_chat_completion(self, messages, max_tokens=None, stream=False, **sampling):
            seen.append([dict(m) for m in messages])
            parts = [Delta(reasoning_content="mull"), Delta(reasoning_content="ing"), Delta(content="Answer "),
                     Delta(content=str(len(seen)))]
            return iter([ChatCompletionChunk(id="x", created=0, model="m",
                                             choices=[ChunkChoice(index=0, delta=p)]) for p in parts])

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    assert repl(Model(), {}, stdin=io.StringIO("one\ntwo\n"), out=out) == 0
    assert f"{DIM}mulling{RESET}Answer 1\n" in out.getvalue() and "<think>" not in out.getvalue()
    assert seen[1] == [{"role": "user", "content": "one"}, {"role": "assistant", "content": "Answer 1"},
                       {"role": "user", "content": "two"}]
    plain = io.StringIO()
    repl(Model(), {}, stdin=io.StringIO("x\n"), out=plain)
    assert "<think>mulling</think>Answer" in plain.getvalue()  # not a terminal: the text as it is


def test_inspect_takes_a_catalog_name_and_a_closed_pipe():
    by_name = cli("inspect", "--json", "smollm2-135m-instruct")
    assert by_name.returncode == 0, by_name.stderr
    assert json.loads(by_name.stdout)["metadata"]["general.architecture"]["value"] == "llama"
    for extra in ([], ["--json", "--all"]):
        piped = subprocess.run(f"{sys.executable} -m llamaplug.cli inspect {' '.join(extra)} smollm2-135m-instruct "
                               "| head -c 100", shell=True, capture_output=True, text=True, timeout=120)
        assert len(piped.stdout) == 100 and "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr


def test_bench_explains_its_flags_and_shows_progress(smollm2_path):
    helped = cli("bench", "--help")
    assert "prompt processing" in helped.stdout and "fastest counts" in helped.stdout
    done = cli("bench", "-m", str(smollm2_path), "-t", str(THREADS), "--pp", "32", "--tg", "4", "--inner", "1",
               "--batched", "")
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith("bench: ")]
    assert any("pp32" in line for line in progress) and any("tg4" in line for line in progress)


def test_info_says_what_gpu_offload_means_here():
    done = cli("info")
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("gpu offload: "))
    devices = done.stdout.split("devices:\n", 1)[1].split("gpu offload:", 1)[0]
    has_gpu = any(row.split()[1] != "cpu" for row in devices.splitlines() if row.strip())
    assert line.startswith("gpu offload: yes, to ") if has_gpu else line.startswith("gpu offload: no")


def test_the_collector_runs_again_after_a_command_and_after_a_failed_serve(tmp_path):
    """main() holds the garbage collector off while a command starts (a server's start made ~200 collections
    that freed next to nothing); it is on again when the command is done, a serve that failed included."""
    import gc

    from llamaplug import cli
    from llamaplug.cli import main

    assert gc.isenabled()
    with serve_logging_put_back():  # else the root logger stays at ERROR for the later test files of this process
        assert main(["serve", "-m", str(tmp_path / "missing.gguf"), "--port", "0"]) == 1
    assert gc.isenabled()
    assert main(["inspect", str(tmp_path / "missing.gguf")]) == 1
    assert gc.isenabled()
    gc.disable()  # a process that chose to run without it keeps its choice
    try:
        assert main(["inspect", str(tmp_path / "missing.gguf")]) == 1
        assert not gc.isenabled()
        with serve_logging_put_back():
            assert main(["serve", "-m", str(tmp_path / "missing.gguf"), "--port", "0"]) == 1
        assert not gc.isenabled()
        cli._started()  # the end of a serve's start turns on only what main() itself held off
        assert not gc.isenabled()
    finally:
        gc.enable()
