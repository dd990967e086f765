"""schemathesis over the whole OpenAPI document `llamaplug serve` publishes: no request, however odd, is a 5xx.

Every operation (OpenAI's and llama-server's: /completion, /tokenize, /slots, /v1/rerank,
...) gets generated bodies, both valid and invalid for its schema; the only check is
schemathesis's not_a_server_error. The server runs with -n 4 (a short default
n_predict, so generated requests end quickly) and a slot folder of its own.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from llamaplug_testing import llamaplug_server

EXAMPLES = 8  # per operation: the run stays well under a minute on two cores


def test_no_request_is_a_server_error(smollm2_path, tmp_path):
    slots = tmp_path / "slots"
    slots.mkdir()
    with llamaplug_server(smollm2_path, "-np", "2", "-c", "512", "-n", "4", "--slot-save-path", str(slots), "--metrics"
                          ) as (port, _):
        url = f"http://127.0.0.1:{port}/openapi.json"
        with urllib.request.urlopen(url, timeout=10) as resp:
            paths = set(json.loads(resp.read())["paths"])
        assert {"/completion", "/infill", "/tokenize", "/detokenize", "/apply-template", "/props", "/slots",
                "/slots/{id_slot}", "/v1/rerank", "/v1/embeddings", "/v1/completions", "/v1/chat/completions",
                "/metrics", "/health"} <= paths
        run = subprocess.run(
            [str(Path(sys.executable).with_name("schemathesis")), "run", url, "--checks", "not_a_server_error",
             "--max-examples", str(EXAMPLES), "--seed", "24", "--generation-deterministic", "--no-color",
             "--request-timeout", "60", "--workers", "1"],
            capture_output=True, text=True, timeout=600, cwd=tmp_path)  # its .schemathesis cache goes there
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    generated = re.search(r"(\d+) generated", run.stdout)
    assert generated and int(generated.group(1)) >= 10 * len(paths), run.stdout[-3000:]  # it did run them
    assert all(p.parent == slots for p in slots.rglob("*"))  # no file left the slot folder
