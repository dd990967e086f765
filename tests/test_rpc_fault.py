"""A stopped RPC server whose devices are still registered: the next load is an error, not ggml-rpc's abort of the
whole process ("Failed to connect"), and loads work again once the server is back.

In a child process (RPC servers join a process for good, and a regression would kill it): the child starts a
loopback `llamaplug rpc-server`, generates with the model's layers on its device, stops it, loads again (a
BackendError naming the server), starts it again on the same port and generates the same tokens.
"""

from __future__ import annotations

import textwrap

from llamaplug_testing import free_port, run_isolated


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
