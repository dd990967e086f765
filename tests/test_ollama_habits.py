"""What an Ollama user does without thinking, on `llamaplug serve` (issue 48 parts 3 and 4).

One server of a models dir: SmolLM2 under two names (smol-a, smol-b: with two models an unknown name
is a 404, so every name must resolve; smol-b has models.toml's chat_template "chatml-tools") and two tiny
generated GGUFs that are only shown, never loaded (one whose chat template offers tools and thinking and
whose vocabulary has fill-in-the-middle tokens, one reranker with a pooling type). Clients are the official
`ollama` and `openai` ones, and httpx sending curl's default form Content-Type. The capabilities expected
are Ollama's own rules (server/images.go, Model.Capabilities) applied to what gguf-py reads in each file.
"""

from __future__ import annotations

import json

import gguf
import httpx
import numpy as np
import openai
import pytest
from fixtures import tiny_gguf
from llamaplug_testing import llamaplug_server

ollama = pytest.importorskip("ollama", reason="the official Ollama client (requirements-reference.txt)")

ASK = [{"role": "user", "content": "Name three fruits."}]
FORM = {"Content-Type": "application/x-www-form-urlencoded"}  # what `curl -d` sends
TEMPLATE = ("{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
            "{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n<think>\n")


def _tools_and_thinking(w) -> list:
    w.add_name("tiny tools and thinking")
    tiny_gguf.add_llama_header(w, tiny_gguf.N_CTX_TRAIN, tiny_gguf.N_EMBD, tiny_gguf.N_LAYER, tiny_gguf.N_FF,
                               tiny_gguf.N_HEAD, tiny_gguf.N_HEAD_KV)
    w.add_chat_template(TEMPLATE)
    for key, value in tiny_gguf.FIM:
        w.add_uint32(key, value)
    return tiny_gguf._tensors(np.random.default_rng(0))


@pytest.fixture(scope="module")
def folder(tmp_path_factory, smollm2_path):
    folder = tmp_path_factory.mktemp("models")
    for name in ("smol-a.gguf", "smol-b.gguf"):
        (folder / name).symlink_to(smollm2_path)
    tiny_gguf.write_gguf(folder / "tools-think.gguf", "llama", _tools_and_thinking)
    tiny_gguf.write_tiny_reranker(folder / "rank.gguf")
    (folder / "models.toml").write_text('["smol-b.gguf"]\nchat_template = "chatml-tools"\n')
    return folder


@pytest.fixture(scope="module")
def port(folder):
    with llamaplug_server(None, "--models-dir", str(folder), "--parallel", "1", "-c", "1024", "-t", "1") as (port, _):
        yield port


@pytest.fixture(scope="module")
def client(port):
    return ollama.Client(host=f"http://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def oai(port):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)


def ollamas_capabilities(path) -> set[str]:
    """Ollama's Model.Capabilities over the file's keys as gguf-py reads them (its template: tools, thinking)."""
    reader = gguf.GGUFReader(str(path))
    keys = set(reader.fields)
    arch = reader.fields["general.architecture"].contents()
    template = reader.fields["tokenizer.chat_template"].contents() if "tokenizer.chat_template" in keys else ""
    found = {"embedding" if f"{arch}.pooling_type" in keys else "completion"}
    if "tools" in template:
        found.add("tools")
    if "<think>" in template:
        found.add("thinking")
    if {"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id"} <= keys:
        found.add("insert")
    return found


def test_lists_name_models_without_gguf(client, oai):
    names = {"smol-a", "smol-b", "tools-think", "rank"}
    assert {m.model for m in client.list().models} == {f"{n}:latest" for n in names}
    assert {m.id for m in oai.models.list().data} == names


def test_the_name_ollama_lists_works_on_v1(client, oai):
    for listed in sorted(m.model for m in client.list().models if m.model.startswith("smol")):
        reply = oai.chat.completions.create(model=listed, messages=ASK, max_tokens=2, temperature=0)
        assert reply.model == listed and reply.choices[0].message.content


@pytest.mark.parametrize("name", ["smol-b", "smol-b:latest", "smol-b.gguf", "smol-b.gguf:latest"])
def test_every_form_of_a_name_on_both_apis(client, oai, name):
    assert client.chat(model=name, messages=ASK, options={"num_predict": 1, "temperature": 0}).done
    assert client.show(name).details.family == "llama"
    assert oai.chat.completions.create(model=name, messages=ASK, max_tokens=1).choices[0].message.content


def test_api_bodies_are_json_whatever_the_content_type(port, client):
    url = f"http://127.0.0.1:{port}"
    shown = httpx.post(f"{url}/api/show", content=json.dumps({"model": "smol-a"}), headers=FORM, timeout=60)
    assert shown.status_code == 200 and shown.json()["details"]["family"] == "llama"
    body = {"model": "smol-a", "messages": ASK, "stream": False, "options": {"num_predict": 1}}
    for kind in ("application/x-www-form-urlencoded", "text/plain", "application/octet-stream"):
        chat = httpx.post(f"{url}/api/chat", content=json.dumps(body), headers={"Content-Type": kind}, timeout=120)
        assert chat.status_code == 200 and chat.json()["done"], (kind, chat.text)
    client.copy("smol-a", "doomed")
    assert "doomed:latest" in {m.model for m in client.list().models}
    # Ollama's docs: curl -X DELETE http://localhost:11434/api/delete -d '{"model": "..."}'
    gone = httpx.request("DELETE", f"{url}/api/delete", content=json.dumps({"model": "doomed"}), headers=FORM)
    assert gone.status_code == 200, gone.text
    assert "doomed:latest" not in {m.model for m in client.list().models}


def test_show_says_no_server_path_and_ollamas_capabilities(client, folder, smollm2_path):
    for name in ("smol-a", "tools-think", "rank"):
        shown = client.show(name)
        text = json.dumps(shown.model_dump(mode="json"))
        assert str(folder) not in text and str(smollm2_path.parent) not in text, shown.modelfile
        assert f"FROM {name}" in shown.modelfile
        assert set(shown.capabilities) == ollamas_capabilities(folder / f"{name}.gguf"), name
    assert set(client.show("tools-think").capabilities) == {"completion", "tools", "thinking", "insert"}
    assert client.show("rank").capabilities == ["embedding"]
    assert client.show("smol-a").capabilities == ["completion"]


def test_show_reads_capabilities_from_the_template_the_model_is_served_with(client):
    """models.toml gives smol-b the chat template "chatml-tools": /api/show's capabilities are that template's
    (they were the GGUF's: ["completion"]), as a chat request on smol-b renders with it."""
    assert client.show("smol-b").capabilities == ["completion", "tools"]
