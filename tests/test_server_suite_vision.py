"""The pin's test_vision_api.py on `llamaplug serve` beside its llama-server (issue 48 part 6): SmolLM2 with the
generated projector (tests/fixtures/tiny_mmproj.py, its output the model's 576 wide), the same files on both.

- /v1/models and /models: llama-server's `models` list beside `data`, each entry with the model's capabilities
  ("multimodal" with a projector);
- media in /v1/embeddings and /embeddings (test_vision_embeddings, test_vision_embeddings_oai_content): a prompt
  with media markers and multimodal_data (base64), or OpenAI content parts with image_url; the vectors llama-server
  gives for the same requests (the same model and projector run: the same vectors, to float noise), and a 400
  naming the field for a malformed image or media on a server without a projector.
"""

from __future__ import annotations

import base64
import json
import urllib.request

import numpy as np
import pytest
from fixtures.tiny_mmproj import png_bytes, sample_image, write_tiny_mmproj
from llamaplug_testing import on_both, post_status


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory):
    return write_tiny_mmproj(tmp_path_factory.mktemp("vision") / "mmproj-smollm2.gguf", out_embd=576)


def _script(port: int) -> dict:
    out = {}
    for path in ("/models", "/v1/models"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as resp:
            entry = json.loads(resp.read())["models"][0]
        out[path] = (sorted(entry), entry["capabilities"])
    return out


def test_models_list_names_the_capabilities_as_llama_server(native_tools, smollm2_path, mmproj):
    both = on_both(native_tools, smollm2_path, _script, "-c", "512", "--mmproj", str(mmproj))
    assert both["theirs"]["/v1/models"][1] == ["completion", "multimodal"]
    assert both["ours"] == both["theirs"]


# the suite's two test images are a truck and a cat; these are two generated pictures (a random projector sees noise)
IMAGES = [base64.b64encode(png_bytes(sample_image(48, 64, seed))).decode() for seed in (7, 8)]
PROMPT = "What is this: <__media__>\n"  # the suite's, with llama-server's marker as the suite sets it


def _media(port: int) -> dict:
    img0, img1 = IMAGES
    oai = post_status(port, "/v1/embeddings", {"input": [
        {"content": [{"type": "text", "text": "What is this: "},
                     {"type": "image_url", "image_url": {"url": "data:image/png;base64," + img0}},
                     {"type": "text", "text": "\n"}]},
        {"prompt_string": PROMPT, "multimodal_data": [img0]},
        {"prompt_string": PROMPT, "multimodal_data": [img1]},
        "What is this: \n",
        {"prompt_string": "A <__media__> and a <__media__> here.\n", "multimodal_data": [img0, img1]},
    ]})
    native = post_status(port, "/embeddings", {"content": [
        {"prompt_string": PROMPT, "multimodal_data": [img1]}, {"prompt_string": PROMPT}]})
    bad = [post_status(port, "/v1/embeddings", {"input": given}) for given in (
        [{"prompt_string": PROMPT, "multimodal_data": ["malformed"]}],
        {"content": [{"type": "text", "text": "What is this: "},
                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}]},  # "hello"
    )]
    return {"oai": (oai[0], [np.array(d["embedding"]) for d in oai[1]["data"]] if oai[0] == 200 else oai[1]),
            "native": (native[0], [np.array(d["embedding"][0]) for d in native[1]] if native[0] == 200 else None),
            "bad": [(status, body.get("error", {}).get("param")) for status, body in bad]}


def _close(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_media_embeddings_as_llama_server(native_tools, smollm2_path, mmproj, monkeypatch):
    monkeypatch.setenv("LLAMA_MEDIA_MARKER", "<__media__>")  # llama-server's is random unless set (the suite sets it)
    both = on_both(native_tools, smollm2_path, _media, "-c", "1024", "-b", "512", "--embeddings", "--pooling",
                   "mean", "--mmproj", str(mmproj))
    theirs, ours = both["theirs"], both["ours"]
    assert theirs["oai"][0] == theirs["native"][0] == 200
    assert ours["oai"][0] == 200, ours["oai"][1]
    assert ours["native"][0] == 200
    t, o = theirs["oai"][1], ours["oai"][1]
    assert len(o) == len(t) == 5
    assert np.array_equal(o[0], o[1])  # the same image and text in either shape
    # the image is read, and which one it is (the random projector's two pictures: cosine 0.9992 on both servers)
    assert np.abs(o[0] - o[2]).max() > 1e-3 and np.abs(o[0] - o[3]).max() > 1e-2
    for i, (mine, ref) in enumerate(zip(o, t)):  # the same model and projector: the same vectors (6e-8 here)
        assert _close(mine, ref) > 0.9999 and np.abs(mine - ref).max() < 1e-4, i
    for mine, ref in zip(ours["native"][1], theirs["native"][1]):
        assert np.abs(mine - ref).max() < 1e-4
    assert np.abs(ours["native"][1][0] - o[2]).max() < 1e-6  # /embeddings pools as /v1/embeddings
    assert all(status != 200 for status, _ in theirs["bad"])
    assert ours["bad"] == [(400, "input[0].multimodal_data[0]"), (400, "input.content[1]")]


def _no_projector(port: int) -> list:
    return [post_status(port, "/v1/embeddings", {"input": given})[0:2] for given in (
        [{"prompt_string": PROMPT, "multimodal_data": [IMAGES[0]]}],
        {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + IMAGES[0]}}]})]


def test_media_without_a_projector_is_a_400_naming_the_field(native_tools, smollm2_path, monkeypatch):
    monkeypatch.setenv("LLAMA_MEDIA_MARKER", "<__media__>")
    both = on_both(native_tools, smollm2_path, _no_projector, "-c", "512", "--embeddings", "--pooling", "mean")
    assert all(status != 200 for status, _ in both["theirs"])
    assert [(status, body["error"]["param"]) for status, body in both["ours"]] == [
        (400, "input[0].multimodal_data"), (400, "input.content[0]")]
