"""/v1/models and /models as the pin's test_vision_api.py reads them (issue 48 part 6): llama-server's `models`
list beside `data`, each entry with the model's capabilities ("multimodal" with a projector). SmolLM2 with the
generated projector (tests/fixtures/tiny_mmproj.py, its output the model's 576 wide) on the pin's llama-server and
on `llamaplug serve`, compared.
"""

from __future__ import annotations

import json
import urllib.request

from fixtures.tiny_mmproj import write_tiny_mmproj
from llamaplug_testing import on_both


def _script(port: int) -> dict:
    out = {}
    for path in ("/models", "/v1/models"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as resp:
            entry = json.loads(resp.read())["models"][0]
        out[path] = (sorted(entry), entry["capabilities"])
    return out


def test_models_list_names_the_capabilities_as_llama_server(native_tools, smollm2_path, tmp_path):
    mmproj = write_tiny_mmproj(tmp_path / "mmproj-smollm2.gguf", out_embd=576)
    both = on_both(native_tools, smollm2_path, _script, "-c", "512", "--mmproj", str(mmproj))
    assert both["theirs"]["/v1/models"][1] == ["completion", "multimodal"]
    assert both["ours"] == both["theirs"]
