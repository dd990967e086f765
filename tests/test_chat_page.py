"""The chat page at `/` of a real `llamaplug serve`, driven in headless Chromium (Playwright over Debian's chromium).

One server (with --api-key, so the page's key field is part of every test) and one browser
for the module. The page sends temperature 0 by default, so its streamed reply must equal
the greedy reply that /v1/chat/completions gives for the same messages.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from llamaplug_testing import llamaplug_server

sync_api = pytest.importorskip("playwright.sync_api", reason="the chat page test needs playwright")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
KEY = "page-test-key"


@pytest.fixture(scope="module")
def server(smollm2_path):
    with llamaplug_server(smollm2_path, "--parallel", "1", "-c", "2048", "--api-key", KEY, "--metrics") as (port, _):
        yield port


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip("no chromium to drive (apt install chromium; make test's test-sysdeps installs it)")
    with sync_api.sync_playwright() as p:
        # Playwright's own browser download cannot reach its host here: Debian's chromium does the same job.
        browser = p.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1000, "height": 700})
    page = context.new_page()
    page.goto(f"http://127.0.0.1:{server}/")
    yield page
    context.close()


def api(port: int, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def slots_busy(port: int) -> float:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    return next(float(line.split()[1]) for line in lines if line.startswith("llamaplug_slots_busy "))


def until(page, js: str, arg: object = None, timeout: float = 60) -> None:
    """Poll `js` (a function of `arg`) in the page until it is true.

    Not wait_for_function: that evaluates its predicate with eval, which the page's own
    Content-Security-Policy forbids (and the page is tested under it).
    """
    deadline = time.monotonic() + timeout
    while not page.evaluate(js, arg):
        assert time.monotonic() < deadline, f"timed out waiting for {js}"
        time.sleep(0.02)


def enter_key(page) -> None:
    page.fill("#api-key", KEY)
    page.dispatch_event("#api-key", "change")
    until(page, "() => document.querySelectorAll('#model option').length > 0")


def ask(page, text: str, max_tokens: int) -> None:
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#prompt", text)
    page.click("#send")


def last_reply(page):
    return page.locator(".msg.assistant").last


def wait_state(page, state: str, timeout: float = 60) -> None:
    until(page, "s => { const m = [...document.querySelectorAll('.msg.assistant')].pop(); "
                "return m !== undefined && m.dataset.state === s }", state, timeout)


def test_the_page_and_its_files_are_served_without_a_key_and_nothing_else_is(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server}/", timeout=10) as resp:
        assert resp.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in resp.headers["content-security-policy"]
        assert b'<script src="/static/chat.js"' in resp.read()
    with urllib.request.urlopen(f"http://127.0.0.1:{server}/static/chat.js", timeout=10) as resp:
        assert resp.headers["content-type"].startswith("text/javascript")
    for bad in ("/static/..%2Fapp.py", "/static/chat.py", "/static/nothing.js", "/static/.hidden.js"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{server}{bad}", timeout=10)
        assert err.value.code == 404, bad
        assert json.loads(err.value.read())["error"]["message"]
    with pytest.raises(urllib.error.HTTPError) as err:  # the API itself still needs the key
        urllib.request.urlopen(f"http://127.0.0.1:{server}/v1/models", timeout=10)
    assert err.value.code == 401


def test_without_the_key_the_page_says_so_and_with_it_lists_the_model(page, server, smollm2_path):
    until(page, "() => document.getElementById('status').textContent.includes('API key')")
    enter_key(page)
    assert page.locator("#model option").all_text_contents() == [smollm2_path.stem]
    assert page.locator("#status").text_content() == ""
    assert page.evaluate("localStorage.getItem('llamaplug.apiKey')") == KEY
    assert page.locator("#image-label").is_hidden()  # SmolLM2 has no projector
    assert api(server, "/v1/models")["data"][0]["capabilities"] == ["completion"]
    page.reload()  # the key is remembered
    until(page, "() => document.querySelectorAll('#model option').length > 0")


def test_image_upload_is_offered_for_a_model_with_a_projector(page):
    # The page's side only: /v1/models answered as a server with a projector answers it.
    page.route("**/v1/models", lambda route: route.fulfill(json={"object": "list", "data": [
        {"id": "text-only", "object": "model", "created": 0, "owned_by": "x", "capabilities": ["completion"]},
        {"id": "with-vision", "object": "model", "created": 0, "owned_by": "x",
         "capabilities": ["completion", "multimodal"]}]}))
    page.reload()
    until(page, "() => document.querySelectorAll('#model option').length === 2")
    assert page.locator("#image-label").is_hidden()
    page.select_option("#model", "with-vision")
    assert page.locator("#image-label").is_visible()


def test_a_streamed_reply_grows_then_equals_the_greedy_reply(page, server, tmp_path_factory):
    enter_key(page)
    # Every length the reply's text takes while it streams, seen from inside the page.
    page.evaluate("""() => { window.seen = [];
        new MutationObserver(() => { const m = [...document.querySelectorAll('.msg.assistant .text')].pop();
                                     if (m) window.seen.push(m.textContent.length); })
            .observe(document.getElementById('conversation'), {childList: true, subtree: true, characterData: true});
    }""")
    question = "Name three colours of the rainbow and say one thing about each."
    ask(page, question, 48)
    wait_state(page, "done")
    seen = page.evaluate("window.seen")
    grown = [n for n in dict.fromkeys(seen) if n > 0]
    assert len(grown) >= 3 and grown == sorted(grown), seen  # it arrived in pieces, each longer than the last
    shown = last_reply(page).locator(".text").text_content()
    want = api(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": question}],
                                                "temperature": 0, "max_tokens": 48})
    assert shown == want["choices"][0]["message"]["content"]
    assert last_reply(page).get_attribute("data-finish") == want["choices"][0]["finish_reason"]
    assert page.locator(".msg.user .text").last.text_content() == question
    assert page.locator("#send").is_enabled() and page.locator("#stop").is_disabled()
    shot = tmp_path_factory.mktemp("chat_page") / "chat_page.png"
    page.screenshot(path=str(shot))
    print(f"chat page screenshot: {shot}")


def test_stop_ends_the_stream_frees_the_slot_and_the_next_message_answers(page, server):
    enter_key(page)
    ask(page, "Write a very long story about a dragon who learns to cook.", 1000)
    until(page, "() => [...document.querySelectorAll('.msg.assistant .text')].pop().textContent.length > 20")
    page.click("#stop")
    wait_state(page, "stopped", timeout=10)
    stopped = last_reply(page).locator(".text").text_content()
    deadline = time.monotonic() + 15
    while slots_busy(server) and time.monotonic() < deadline:  # the server cancels when the client goes away
        time.sleep(0.1)
    assert slots_busy(server) == 0
    assert last_reply(page).locator(".text").text_content() == stopped  # nothing arrives after Stop
    ask(page, "Say hello.", 12)
    wait_state(page, "done")
    assert last_reply(page).locator(".text").text_content().strip()
    assert page.locator(".msg.assistant").count() == 2
