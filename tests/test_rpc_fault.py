"""A stopped RPC server whose devices are still registered: the next load is an error, not ggml-rpc's abort of the
whole process ("Failed to connect"), and loads work again once the server is back.

In a child process (RPC servers join a process for good, and a regression would kill it): the child starts a
loopback `llamaplug rpc-server`, generates with the model's layers on its device, stops it, loads again (a
BackendError naming the server), starts it again on the same port and generates the same tokens.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import anthropic
import openai
import pytest
from llamaplug_testing import free_port, llamaplug_server, run_isolated


def test_a_dead_rpc_server_is_an_error_and_its_return_is_served(smollm2_path):
    port = free_port()
    code = textwrap.dedent(f"""
        import json, socket, subprocess, sys, time
        import llamaplug as lp

        ENDPOINT = "127.0.0.1:{port}"

        def rpc_server():
            proc = subprocess.Popen([sys.executable, "-m", "llamaplug.cli", "rpc-server", "--port", "{port}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", {port}), timeout=1).close()
                    return proc
                except OSError:
                    time.sleep(0.2)
            raise SystemExit("the RPC server did not start")

        def generate():
            params = lp.LlamaParams(model_path={str(smollm2_path)!r}, n_ctx=256, n_threads=2, n_gpu_layers=99,
                                    rpc_servers=[ENDPOINT])
            with lp.Llama.load(params) as llama:
                return llama.create_completion("The capital of France is", max_tokens=8).tokens

        out = {{}}
        server = rpc_server()
        out["first"] = generate()
        server.kill()
        server.wait()
        try:
            generate()
            out["dead"] = "loaded"
        except lp.LlamaError as exc:
            out["dead"] = [type(exc).__name__, str(exc)]
        server = rpc_server()
        try:
            out["back"] = generate()
        finally:
            server.kill()
        print("RESULT", json.dumps(out))
    """)
    out = run_isolated(code, timeout=600, result=True)
    kind, message = out["dead"]
    assert kind == "BackendError" and f"127.0.0.1:{port}" in message and "does not answer" in message
    assert out["back"] == out["first"] and len(out["first"]) == 8


def test_an_rpc_server_killed_mid_decode_is_a_backend_error_and_a_reload_works(smollm2_path):
    """The RPC server dies while a generation decodes on its device: the generation ends in a BackendError naming
    it (ggml-rpc aborted the process; the decode during which it died returns success and zero logits, so the
    context checks the connection after each decode), later decodes fail the same way, and once the server is
    back a fresh load generates what the first did."""
    port = free_port()
    code = textwrap.dedent(f"""
        import json, socket, subprocess, sys, time
        import llamaplug as lp

        def _rpc_server(port):
            proc = subprocess.Popen([sys.executable, "-m", "llamaplug.cli", "rpc-server", "--port", str(port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    return proc
                except OSError:
                    time.sleep(0.2)
            raise SystemExit("the RPC server did not start")

        params = lp.LlamaParams(model_path={str(smollm2_path)!r}, n_ctx=512, n_threads=2, n_gpu_layers=99,
                                rpc_servers=["127.0.0.1:{port}"])
        out = {{}}
        server = _rpc_server({port})
        with lp.Llama.load(params) as llama:
            no_end = {{t: -100.0 for t in (llama.model.eos, llama.model.eot) if t is not None}}
            out["first"] = llama.create_completion("Once upon a time", max_tokens=8).tokens
            got = []
            try:
                for chunk in llama.create_completion("Once upon a time", max_tokens=400, stream=True,
                                                     logit_bias=no_end):
                    got.append(chunk.text)
                    if len(got) == 3:
                        server.kill()
                        server.wait()
                out["streamed"] = "finished"
            except lp.LlamaError as exc:
                out["streamed"] = [type(exc).__name__, str(exc), len(got)]
            try:
                llama.create_completion("Hello", max_tokens=4)
                out["later"] = "generated"
            except lp.LlamaError as exc:
                out["later"] = [type(exc).__name__, str(exc)]
        server = _rpc_server({port})
        try:
            with lp.Llama.load(params) as llama:
                out["back"] = llama.create_completion("Once upon a time", max_tokens=8).tokens
        finally:
            server.kill()
        print("RESULT", json.dumps(out))
    """)
    out = run_isolated(code, timeout=600, result=True)
    kind, message, n_before = out["streamed"]
    assert kind == "BackendError" and f"127.0.0.1:{port}" in message and n_before >= 3, out["streamed"]
    assert out["later"][0] == "BackendError", out["later"]
    assert out["back"] == out["first"] and len(out["first"]) == 8


def _rpc_server(port: int) -> subprocess.Popen:
    """A loopback `llamaplug rpc-server` on `port`, once it takes connections."""
    proc = subprocess.Popen([sys.executable, "-m", "llamaplug.cli", "rpc-server", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            assert proc.poll() is None, "the RPC server exited"
            time.sleep(0.2)
    proc.kill()
    pytest.fail("the RPC server did not start")


def test_an_rpc_server_killed_under_load_fails_requests_and_serving_resumes(smollm2_path, llama):
    """`llamaplug serve --rpc` with every layer on the RPC server's device, streams decoding: the RPC server is
    killed. The serving process stays up; the streams end in their API's in-stream error event (OpenAI's,
    Anthropic's) and new requests get OpenAI's error body (as the `openai` and `anthropic` clients read them),
    /health answers; once the RPC server is back on its port, a request generates what it did before the kill."""
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    # No end of generation: the streams are still decoding when the server dies.
    no_end = {str(t): -100 for t in {llama.model.eos, llama.model.eot} if t is not None}
    rpc = _rpc_server(port)
    try:
        with llamaplug_server(smollm2_path, "--rpc", endpoint, "-ngl", "99", "-np", "3", "-c", "3072") as (http, proc):
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{http}/v1", api_key="unused", max_retries=0,
                                   timeout=120)

            def greedy() -> str:
                return client.completions.create(model="m", prompt="The capital of France is", max_tokens=12,
                                                 temperature=0).choices[0].text

            before = greedy()
            started = threading.Barrier(4, timeout=120)
            ends: list[object] = []

            def stream(i: int) -> None:
                chunks = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"Tell a long story, number {i}."}],
                    max_tokens=2000, temperature=0, stream=True, logit_bias=no_end)
                try:
                    for n, _ in enumerate(chunks):
                        if n == 2:
                            started.wait()
                    ends.append("finished")
                except openai.APIError as exc:
                    ends.append(exc)

            def anthropic_stream() -> None:
                claude = anthropic.Anthropic(base_url=f"http://127.0.0.1:{http}", api_key="unused", max_retries=0,
                                             timeout=120)
                events = claude.messages.create(
                    model="m", max_tokens=2000, stream=True,
                    messages=[{"role": "user", "content": "Tell a very long story about a lighthouse."}])
                try:
                    deltas = 0
                    for event in events:
                        deltas += event.type == "content_block_delta"
                        if deltas == 3 and event.type == "content_block_delta":
                            started.wait()
                    ends.append("finished")
                except anthropic.APIStatusError as exc:
                    ends.append(exc)

            threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
            threads.append(threading.Thread(target=anthropic_stream))
            for t in threads:
                t.start()
            started.wait()  # every stream has tokens: kill the RPC server under them
            rpc.kill()
            rpc.wait()
            for t in threads:
                t.join(timeout=120)
            assert not any(t.is_alive() for t in threads)
            assert len(ends) == 3, ends
            openai_ends = [e for e in ends if isinstance(e, openai.APIError)]
            claude_ends = [e for e in ends if isinstance(e, anthropic.APIStatusError)]
            assert len(openai_ends) == 2 and len(claude_ends) == 1, ends
            for e in openai_ends:  # OpenAI's in-stream event: its error body, naming the server
                assert endpoint in e.message and e.code == "backend_failed", (e.message, e.body)
            # Anthropic's: an `event: error` with its error body
            assert claude_ends[0].body["type"] == "error", claude_ends[0].body
            error = claude_ends[0].body["error"]
            assert error["type"] == "api_error" and endpoint in error["message"], error

            assert proc.poll() is None
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/health", timeout=10) as resp:
                assert resp.status == 200
            for _ in range(2):  # while the server is down: each request is an error in OpenAI's shape
                with pytest.raises(openai.InternalServerError) as down:
                    greedy()
                assert down.value.status_code == 500 and endpoint in down.value.message
                assert down.value.body["code"] == "model_load_failed", down.value.body
            assert proc.poll() is None

            rpc = _rpc_server(port)
            assert greedy() == before
            assert proc.poll() is None
    finally:
        rpc.kill()
        rpc.wait()
