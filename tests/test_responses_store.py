"""Stateful Responses: `store`, `previous_response_id`, GET/DELETE /v1/responses/{id} and its input_items,
driven by the real `openai` client against `llamaplug serve` (SmolLM2).

The reference for a chained turn is the same conversation sent whole: its prompt (the input_tokens count) and
its greedy reply must be the ones the chained request gets. The store is a file: after the module's server is
stopped (its process gone) and started again on the same file, it continues a chain the stopped one started; a
key never reaches another key's responses.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.request

import openai
import pytest
from llamaplug_testing import RestartableServer, llamaplug_server

KEYS = ("key-a", "key-b")
TOKENS = 8
MAX_MESSAGES = 4
FIRST = "My name is Ada. Say hello to me."
SECOND = "What did I say my name was?"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return tmp_path_factory.mktemp("responses") / "responses.sqlite3"


@pytest.fixture(scope="module")
def serve(smollm2_path, db):
    """The module's server; test_a_restart_between_two_chained_turns restarts it (same port, same file)."""
    with RestartableServer(smollm2_path, "-c", "2048", "--parallel", "2", "--api-key", ",".join(KEYS),
                           "--responses-db", str(db), "--max-messages", str(MAX_MESSAGES)) as serve:
        yield serve


@pytest.fixture(scope="module")
def server(serve):
    return serve.port


def client(port: int, key: str = KEYS[0]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def oai(server):
    return client(server)


@pytest.fixture(scope="module")
def model(oai):
    return oai.models.list().data[0].id


def create(oai, model, **kwargs):
    return oai.responses.create(model=model, max_output_tokens=TOKENS, temperature=0, **kwargs)


def input_tokens(port: int, body: dict, key: str = KEYS[0]) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/responses/input_tokens", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())["input_tokens"]


def whole(first_reply: str) -> list[dict]:
    return [{"role": "user", "content": FIRST}, {"role": "assistant", "content": first_reply},
            {"role": "user", "content": SECOND}]


@pytest.fixture(scope="module")
def first(oai, model):
    return create(oai, model, input=FIRST)


def test_a_chained_turn_is_the_whole_conversation(oai, model, server, first):
    assert first.store is True and first.previous_response_id is None and first.output_text
    second = create(oai, model, input=SECOND, previous_response_id=first.id)
    assert second.previous_response_id == first.id
    # the prompt cache: the first turn's prompt (and reply) is the chained prompt's prefix, read once
    assert second.usage.input_tokens_details.cached_tokens > 0
    # the chained prompt is the whole conversation's, rendered through the same chat path
    chained = input_tokens(server, {"model": model, "input": SECOND, "previous_response_id": first.id})
    assert chained == input_tokens(server, {"model": model, "input": whole(first.output_text)})
    assert chained > input_tokens(server, {"model": model, "input": FIRST}) + 3
    reference = create(oai, model, input=whole(first.output_text), store=False)
    assert second.output_text == reference.output_text

    items = oai.responses.input_items.list(second.id, order="asc").data
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant"), ("message", "user")]
    assert [i.content[0].text for i in items] == [FIRST, first.output_text, SECOND]
    assert items[1].id == first.output[0].id  # the first response's own output item
    newest = oai.responses.input_items.list(second.id, limit=1)  # desc by default, as OpenAI's
    assert [i.id for i in newest.data] == [items[-1].id] and newest.has_more


def test_retrieve_then_delete(oai, model):
    got = create(oai, model, input="Name a colour.", metadata={"n": "1"})
    kept = oai.responses.retrieve(got.id)
    assert kept.id == got.id and kept.output_text == got.output_text and kept.metadata == {"n": "1"}
    assert kept.usage.input_tokens == got.usage.input_tokens
    oai.responses.delete(got.id)
    with pytest.raises(openai.NotFoundError) as missing:
        oai.responses.retrieve(got.id)
    assert missing.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        oai.responses.delete(got.id)
    with pytest.raises(openai.BadRequestError) as chained:  # OpenAI's answer to an id it does not have
        create(oai, model, input="x", previous_response_id=got.id)
    assert chained.value.code == "previous_response_not_found" and chained.value.param == "previous_response_id"


def test_store_false_is_not_kept(oai, model):
    got = create(oai, model, input="Name a colour.", store=False)
    assert got.store is False
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(got.id)


def test_streamed_responses_are_kept(oai, model):
    events = list(create(oai, model, input="Name a fruit.", stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")  # 8 tokens may cut it short
    final = events[-1].response
    kept = oai.responses.retrieve(final.id)
    assert kept.output_text == final.output_text and kept.status == final.status
    second = create(oai, model, input=SECOND, previous_response_id=final.id)
    assert [i.id for i in oai.responses.input_items.list(second.id, order="asc").data][1] == final.output[0].id


def test_a_conversation_is_its_items_before_the_input(oai, model, server, first):
    # OpenAI's Conversations API (the Agents SDK's conversation_id and OpenAIConversationsSession send it)
    conv = oai.conversations.create(items=[{"type": "message", "role": "user", "content": FIRST},
                                           {"type": "message", "role": "assistant", "content": first.output_text}],
                                    metadata={"topic": "names"})
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "names"}
    # the prompt and greedy reply of the whole conversation sent as input
    assert input_tokens(server, {"model": model, "input": SECOND, "conversation": conv.id}) == input_tokens(
        server, {"model": model, "input": whole(first.output_text)})
    second = create(oai, model, input=SECOND, conversation=conv.id)
    assert second.output_text == create(oai, model, input=whole(first.output_text), store=False).output_text
    # the turn's input, then its output, added to the conversation
    items = oai.conversations.items.list(conv.id, order="asc").data
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant")] * 2
    assert [i.content[0].text for i in items] == [FIRST, first.output_text, SECOND, second.output_text]
    assert items[-1].id == second.output[0].id
    newest = oai.conversations.items.list(conv.id, limit=1)  # desc by default, as OpenAI's
    assert [i.id for i in newest.data] == [items[-1].id] and newest.has_more
    third = create(oai, model, input="Thanks!", conversation={"id": conv.id})
    assert len(oai.conversations.items.list(conv.id).data) == 6 and third.output_text


def test_conversation_items_and_keys(server, oai, model):
    conv = oai.conversations.create()
    other = client(server, KEYS[1])
    for call in (lambda: other.conversations.retrieve(conv.id), lambda: other.conversations.items.list(conv.id),
                 lambda: other.conversations.delete(conv.id),
                 lambda: create(other, model, input="Hi", conversation=conv.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError) as both:  # OpenAI's: one or the other
        create(oai, model, input="Hi", conversation=conv.id, previous_response_id="resp_1")
    assert both.value.param == "conversation"
    added = oai.conversations.items.create(conv.id, items=[{"type": "message", "role": "user", "content": "Hi"}])
    item = added.data[0]
    assert item.content[0].text == "Hi"
    assert oai.conversations.items.retrieve(item.id, conversation_id=conv.id).id == item.id
    assert oai.conversations.items.delete(item.id, conversation_id=conv.id).id == conv.id
    assert oai.conversations.items.list(conv.id).data == []
    assert oai.conversations.update(conv.id, metadata={"a": "b"}).metadata == {"a": "b"}
    assert oai.conversations.retrieve(conv.id).metadata == {"a": "b"}
    assert oai.conversations.delete(conv.id).deleted
    with pytest.raises(openai.NotFoundError):
        oai.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError) as missing:
        create(oai, model, input="Hi", conversation=conv.id)
    assert missing.value.param == "conversation"


def test_another_key_never_reads_them(server, oai, model, first, db):
    other = client(server, KEYS[1])
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.input_items.list(first.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(first.id)
    with pytest.raises(openai.BadRequestError) as chained:
        create(other, model, input=SECOND, previous_response_id=first.id)
    assert chained.value.code == "previous_response_not_found"
    assert oai.responses.retrieve(first.id).id == first.id  # still its own key's
    # the file holds a hash of the key, never the key
    with sqlite3.connect(db) as con:
        owners = {o for (o,) in con.execute("SELECT DISTINCT owner FROM responses")}
    assert owners and not any(k in o for o in owners for k in KEYS)


def test_a_restart_between_two_chained_turns(serve, oai, model, first):
    # the server that answered the first turn stops, its process gone, before one on the same file starts
    assert serve.restart().returncode is not None
    second = create(oai, model, input=SECOND, previous_response_id=first.id)
    assert [i.content[0].text for i in oai.responses.input_items.list(second.id, order="asc").data] == [
        FIRST, first.output_text, SECOND]
    assert second.output_text == create(oai, model, input=whole(first.output_text), store=False).output_text


def test_no_responses_store(smollm2_path, tmp_path):
    with llamaplug_server(smollm2_path, "-c", "512", "--no-responses-store") as (port, _):
        oai = client(port)
        got = oai.responses.create(model="m", input="Hi", max_output_tokens=2)
        assert got.store is False  # it says it was not kept
        with pytest.raises(openai.NotFoundError):
            oai.responses.retrieve(got.id)
        with pytest.raises(openai.BadRequestError) as chained:
            oai.responses.create(model="m", input="Hi", max_output_tokens=2, previous_response_id=got.id)
        assert chained.value.param == "previous_response_id"
        with pytest.raises(openai.BadRequestError) as conversation:
            oai.responses.create(model="m", input="Hi", max_output_tokens=2, conversation="conv_1")
        assert conversation.value.param == "conversation"
        with pytest.raises(openai.BadRequestError):
            oai.conversations.create()


def test_unknown_input_items_page(server, first):
    req = urllib.request.Request(f"http://127.0.0.1:{server}/v1/responses/{first.id}/input_items?after=nope",
                                 headers={"Authorization": f"Bearer {KEYS[0]}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=30)
    assert refused.value.code == 400 and json.loads(refused.value.read())["error"]["param"] == "after"


def test_the_message_bound_holds_for_the_whole_chain(oai, model):
    a = create(oai, model, input="Hi.")
    b = create(oai, model, input="Again.", previous_response_id=a.id)  # 3 items
    with pytest.raises(openai.BadRequestError) as refused:  # 3 + b's reply + 1 > --max-messages
        create(oai, model, input="More.", previous_response_id=b.id)
    assert refused.value.param == "input" and "--max-messages" in refused.value.message


def test_the_size_cap_drops_the_oldest_responses_first(tmp_path):
    from llamaplug.server.response_store import ResponseStore

    store = ResponseStore(tmp_path / "capped.sqlite3", max_bytes=3000)
    for n in range(10):  # ~1 KB each: only the newest fit under the cap
        store.put("", {"id": f"resp_{n}", "text": "x" * 1000}, [])
    kept = [n for n in range(10) if store.get("", f"resp_{n}") is not None]
    assert kept and kept == list(range(10 - len(kept), 10)) and len(kept) <= 2
    with sqlite3.connect(tmp_path / "capped.sqlite3") as db:
        assert db.execute("SELECT total(size) FROM responses").fetchone()[0] <= 3000
    store.close()
