"""Ollama's `images` (/api/chat messages, /api/generate) on `llamaplug serve` with a projector, from the official
`ollama` client: the same media path as /v1/chat/completions' image_url parts.

The reference is the pin's llama-server, serving the same tiny text model and tiny projector
(tests/fixtures), asked the same thing through its /v1/chat/completions with the image as a
data-URL part before the text (where Ollama puts a message's images): the greedy text is equal.
Without a projector, images are Ollama's 400 ({"error": ...}) and the server stays up.
"""

from __future__ import annotations

import base64

import llamaplug_mtmd._cffi  # noqa: F401 - a plugin that failed to build fails here, never skips
import openai
import pytest
from fixtures.tiny_mmproj import png_bytes, sample_image
from llamaplug_testing import llama_server, llamaplug_server

ollama = pytest.importorskip("ollama", reason="the official Ollama client (requirements-reference.txt)")

N_PREDICT = 12
N_CTX = 512
TEXT = "hello world"
SYSTEM = "You describe images."
MODEL = "text.gguf"  # the served name of mtmd_files' text model
ARGS = ("--chat-template", "chatml", "-c", str(N_CTX))


@pytest.fixture(scope="module")
def png() -> str:
    return base64.b64encode(png_bytes(sample_image(seed=1))).decode()


def _openai_messages(png: str, system: str | None = None) -> list[dict]:
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
    user = {"role": "user", "content": [image, {"type": "text", "text": TEXT}]}
    return [{"role": "system", "content": system}, user] if system else [user]


def _v1_text(port: int, messages: list[dict]) -> str:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N_PREDICT, temperature=0)
    return reply.choices[0].message.content


@pytest.fixture(scope="module")
def reference(native_tools, mtmd_files, png) -> dict[str, str]:
    with llama_server(native_tools, mtmd_files["text"], "--mmproj", str(mtmd_files["mmproj"]), *ARGS) as port:
        return {"user": _v1_text(port, _openai_messages(png)),
                "system": _v1_text(port, _openai_messages(png, SYSTEM))}


@pytest.fixture(scope="module")
def served(mtmd_files):
    with llamaplug_server(mtmd_files["text"], "--mmproj", str(mtmd_files["mmproj"]), *ARGS) as (port, _):
        yield port


def test_chat_images_give_llama_servers_text(served, reference, png):
    client = ollama.Client(host=f"http://127.0.0.1:{served}")
    options = {"temperature": 0, "num_predict": N_PREDICT}
    messages = [{"role": "user", "content": TEXT, "images": [png]}]
    reply = client.chat(model=MODEL, messages=messages, options=options)
    assert reply.message.content == reference["user"] != ""
    assert reply.prompt_eval_count > len(TEXT)  # the image's positions count
    streamed = client.chat(model=MODEL, messages=messages, options=options, stream=True)
    assert "".join(p.message.content for p in streamed) == reference["user"]
    # the same media path as the OpenAI route's image_url parts
    assert _v1_text(served, _openai_messages(png)) == reference["user"]


def test_generate_images_give_llama_servers_text(served, reference, png, mtmd_files, tmp_path):
    client = ollama.Client(host=f"http://127.0.0.1:{served}")
    options = {"temperature": 0, "num_predict": N_PREDICT}
    done = client.generate(model=MODEL, prompt=TEXT, system=SYSTEM, images=[png], options=options)
    assert done.response == reference["system"] != ""
    # the client reads a path (or bytes) and sends base64, as Ollama's clients do
    path = tmp_path / "image.png"
    path.write_bytes(base64.b64decode(png))
    streamed = client.generate(model=MODEL, prompt=TEXT, system=SYSTEM, images=[path], options=options,
                               stream=True)
    assert "".join(p.response for p in streamed) == reference["system"]
    with pytest.raises(ollama.ResponseError) as err:  # a raw prompt has no place the images would go
        client.generate(model=MODEL, prompt=TEXT, raw=True, images=[png], options=options)
    assert err.value.status_code == 400 and "images" in err.value.error


def test_images_without_a_projector_are_ollamas_400(mtmd_files, png):
    with llamaplug_server(mtmd_files["text"], *ARGS) as (port, _):
        client = ollama.Client(host=f"http://127.0.0.1:{port}")
        for call in (lambda: client.chat(model=MODEL, messages=[{"role": "user", "content": TEXT, "images": [png]}]),
                     lambda: client.generate(model=MODEL, prompt=TEXT, images=[png])):
            with pytest.raises(ollama.ResponseError) as err:
                call()
            assert err.value.status_code == 400
            assert MODEL in err.value.error and "--mmproj" in err.value.error
        # the server stays up and answers text
        assert client.chat(model=MODEL, messages=[{"role": "user", "content": TEXT}],
                           options={"num_predict": 2}).done
