"""`file://` media URLs on `llamaplug serve` as llama-server's --media-path takes them, beside the pin's llama-server
(SmolLM2 with the generated projector, tests/fixtures/tiny_mmproj.py, as test_server_suite_vision.py).

- without --media-path a file:// URL is a 400 naming the request's field, in every API's media: OpenAI chat,
  Anthropic, Responses, Ollama images, /v1/embeddings' content parts and multimodal_data (the old serve read any
  file on the server's disk there: a 200 for the image outside any folder);
- with --media-path DIR a path relative to DIR is read (file:////x is DIR/x, as llama-server joins them); `..`, an
  absolute path (taken inside DIR, as llama-server does) and a symlink in DIR pointing out are 400s, the same answer
  whether the file outside exists or not. llama-server follows the symlink out (a 200 while its target exists, a
  "does not exist" 400 once it is gone): serve refuses it either way;
- --media-path that is no folder is a usage error naming the flag.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
from fixtures.tiny_mmproj import png_bytes, sample_image, write_tiny_mmproj
from llamaplug_testing import on_both, post_status

PNG = png_bytes(sample_image(48, 64, 7))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The projector, a media folder with an image and a symlink out, and the folder beside it (`outside`)."""
    root = tmp_path_factory.mktemp("media_path")
    mmproj = write_tiny_mmproj(root / "mmproj-smollm2.gguf", out_embd=576)
    media, outside = root / "media", root / "outside"
    media.mkdir()
    outside.mkdir()
    (media / "cat.png").write_bytes(PNG)
    (media / "out.png").symlink_to(outside / "secret.png")
    return mmproj, media, outside


def _requests(url: str, model: str) -> dict[str, tuple[str, dict, str]]:
    """Each API's request with `url` as its image: (path, body, the field the URL is in)."""
    return {
        "openai": ("/v1/chat/completions", {"max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]}]},
            "messages[0].content[1].image_url.url"),
        "anthropic": ("/v1/messages", {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": url}}, {"type": "text", "text": "What is this?"}]}]},
            "messages[0].content[0].source.url"),
        "responses": ("/v1/responses", {"max_output_tokens": 1, "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": url}]}]},
            "input[0].content[1].image_url"),
        "ollama": ("/api/chat", {"model": model, "stream": False, "options": {"num_predict": 1}, "messages": [
            {"role": "user", "content": "What is this?", "images": [url]}]}, "messages[0].images[0]"),
        "embeddings": ("/v1/embeddings", {"input": {"content": [
            {"type": "text", "text": "What is this: "}, {"type": "image_url", "image_url": {"url": url}}]}},
            "input.content[1].image_url.url"),
        "multimodal_data": ("/v1/embeddings", {"input": [
            {"prompt_string": "What is this: <__media__>", "multimodal_data": [url]}]},
            "input[0].multimodal_data[0]"),
    }


def _model(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=60) as resp:
        return json.loads(resp.read())["data"][0]["id"]


def _answer(port: int, api: str, url: str) -> tuple[int, str | None, str | None]:
    """(status, the error's message, its param) of `api`'s request with `url`."""
    path, body, _ = _requests(url, _model(port))[api]
    status, reply = post_status(port, path, body)
    error = reply.get("error") if isinstance(reply, dict) else None
    if isinstance(error, str):  # Ollama's shape
        return status, error, None
    return status, (error or {}).get("message"), (error or {}).get("param")


def _raw(port: int, path: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _refused_without(outside):
    def script(port: int) -> dict:
        out = {api: _answer(port, api, f"file://{outside / 'secret.png'}") for api in _requests("", "")}
        # the same URL spelled with JSON escapes ("\u0066ile:\/\/..."): what the routes read is what was checked
        path, body, _ = _requests(f"file://{outside / 'secret.png'}", "")["openai"]
        escaped = json.dumps(body).replace('"file://', '"\\u0066ile:\\/\\/').encode()
        assert b"file://" not in escaped
        status, reply = _raw(port, path, escaped)
        out["escaped"] = status, reply["error"]["message"]
        return out
    return script


def test_file_urls_are_refused_without_media_path(native_tools, smollm2_path, files, monkeypatch):
    monkeypatch.setenv("LLAMA_MEDIA_MARKER", "<__media__>")  # llama-server's is random unless set
    mmproj, _, outside = files
    (outside / "secret.png").write_bytes(PNG)  # an image anywhere on the server's disk
    both = on_both(native_tools, smollm2_path, _refused_without(outside), "-c", "1024", "--embeddings",
                   "--pooling", "mean", "--mmproj", str(mmproj))
    theirs, ours = both["theirs"], both["ours"]
    for api in ("openai", "anthropic", "responses", "embeddings"):  # llama-server's words, a 400
        assert theirs[api][:2] == (400, "file:// URLs are not allowed unless --media-path is specified"), api
    assert theirs["ollama"][0] == 404  # (no Ollama API there)
    # base64 only there: "file://..." does not decode, "Failed to load image or audio file", a 500 (serve: the 400)
    assert theirs["multimodal_data"][0] == 500
    assert theirs.pop("escaped") == theirs["openai"][:2]
    assert ours.pop("escaped") == ours["openai"][:2]
    for api, (status, message, param) in ours.items():
        field = _requests("", "")[api][2]
        assert status == 400, (api, status, message)
        assert message.startswith(f"{field}: file:// URLs are not allowed unless"), (api, message)
        assert "--media-path" in message
        assert param in (field, None), api  # (Ollama's error has no param)


def _inside_only(media, outside):
    secret = outside / "secret.png"

    def both_ways(port: int, api: str, url: str) -> list:
        """The answer while the file outside exists, then once it is gone."""
        secret.write_bytes(PNG)
        there = _answer(port, api, url)
        secret.unlink()
        return [there, _answer(port, api, url)]

    def script(port: int) -> dict:
        out: dict = {api: _answer(port, api, "file://cat.png") for api in _requests("", "")}
        out["leading slashes"] = _answer(port, "openai", "file:////cat.png")
        out["missing inside"] = _answer(port, "openai", "file://nope.png")
        for api in ("openai", "anthropic", "embeddings"):
            out[f"dotdot {api}"] = both_ways(port, api, "file://../outside/secret.png")
            out[f"absolute {api}"] = both_ways(port, api, f"file://{secret}")
            out[f"symlink {api}"] = both_ways(port, api, "file://out.png")
        # the image read from the folder is the image: its embedding is the data: URL's
        vectors = []
        for url in ("file://cat.png", "data:image/png;base64," + base64.b64encode(PNG).decode()):
            status, reply = post_status(port, *_requests(url, "")["embeddings"][:2])
            vectors.append(np.array(reply["data"][0]["embedding"]) if status == 200 else None)
        out["vectors"] = vectors
        return out

    return script


def test_media_path_reads_inside_the_folder_only(native_tools, smollm2_path, files, monkeypatch):
    monkeypatch.setenv("LLAMA_MEDIA_MARKER", "<__media__>")
    mmproj, media, outside = files
    both = on_both(native_tools, smollm2_path, _inside_only(media, outside), "-c", "1024", "--embeddings",
                   "--pooling", "mean", "--mmproj", str(mmproj), "--media-path", str(media))
    theirs, ours = both["theirs"], both["ours"]
    for api in ("openai", "anthropic", "responses", "embeddings"):
        assert theirs[api][0] == 200, (api, theirs[api])
    for api in _requests("", ""):  # multimodal_data too: serve reads the file, llama-server takes base64 only
        assert ours[api][0] == 200, (api, ours[api])
    assert theirs["leading slashes"][0] == ours["leading slashes"][0] == 200  # DIR/cat.png
    assert theirs["missing inside"][:2] == (400, "file does not exist or cannot be opened: nope.png")
    assert ours["missing inside"][0] == 400 and "file does not exist" in ours["missing inside"][1]
    for api in ("openai", "anthropic", "embeddings"):
        field = _requests("", "")[api][2]
        for case in ("dotdot", "absolute", "symlink"):
            there, gone = ours[f"{case} {api}"]
            assert there[0] == 400 and there[1].startswith(f"{field}: "), (case, api, there)
            assert there == gone, (case, api)  # nothing says whether the file outside exists
        assert "not allowed" in ours[f"dotdot {api}"][0][1] and "not allowed" in ours[f"symlink {api}"][0][1]
        # llama-server: `..` refused, an absolute path looked for inside the folder, a symlink out followed
        assert [s for s, _, _ in theirs[f"dotdot {api}"]] == [400, 400]
        assert [s for s, _, _ in theirs[f"absolute {api}"]] == [400, 400]
        assert [s for s, _, _ in theirs[f"symlink {api}"]] == [200, 400]
    file_vec, data_vec = ours["vectors"]
    assert np.array_equal(file_vec, data_vec)
    assert np.abs(file_vec - theirs["vectors"][0]).max() < 1e-4  # llama-server's vector for the same file


def test_media_path_that_is_no_folder_is_a_usage_error(smollm2_path, tmp_path):
    given = tmp_path / "a-file.png"
    given.write_bytes(PNG)
    for path in (given, tmp_path / "missing"):
        done = subprocess.run([sys.executable, "-m", "llamaplug.cli", "serve", "-m", str(smollm2_path),
                               "--media-path", str(path)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert f"argument --media-path: not a directory: {path}" in done.stderr
