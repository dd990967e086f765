"""AsyncLlama: await and async for over the engine, with the event loop free while tokens are made."""

from __future__ import annotations

import asyncio
import time

import pytest
from llamaplug_testing import THREADS

import llamaplug as lp

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time", "Water boils at",
           "My favourite colour is", "1, 1, 2, 3, 5,"]


@pytest.fixture(scope="module")
def shared(smollm2_path):
    with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=1024, n_seq_max=4, n_threads=THREADS)) as llama:
        yield llama


# Greedy SmolLM2 counts on to the end of its slot (a story or an essay prompt ends after a few tokens).
COUNTING = "Count from 1 to 1000: 1, 2, 3,"


def run(coro):
    return asyncio.run(coro)


async def _busy_slots_drop_to_zero(llama: lp.Llama, within: float = 60) -> bool:
    """Whether the slot is freed; the deadline only ends a hang (a freed slot is seen at once, a leaked one never)."""
    deadline = time.monotonic() + within
    while llama.engine.stats.busy_slots and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return llama.engine.stats.busy_slots == 0


def test_gathered_completions_equal_the_sync_ones(shared):
    want = [shared.create_completion(p, max_tokens=16).text for p in PROMPTS]

    async def main():
        allama = lp.AsyncLlama(shared)
        return await asyncio.gather(*(allama.create_completion(p, max_tokens=16) for p in PROMPTS))

    assert [c.text for c in run(main())] == want


def test_streaming_never_blocks_the_loop(shared):
    """While the engine makes the tokens, the loop runs other tasks: a ticker on the same loop sees the engine's
    token count at many values between the first and the last chunk. A stream that waited for its tokens on the
    loop's thread would never hand the loop to the ticker mid-generation. Counted in tokens, not in seconds."""
    async def main():
        allama = lp.AsyncLlama(shared)
        seen: list[int] = []

        async def ticker():
            while True:
                seen.append(shared.engine.stats.generated_tokens)
                await asyncio.sleep(0.001)

        start = shared.engine.stats.generated_tokens
        tick = asyncio.create_task(ticker())
        parts = []
        async for chunk in await allama.create_completion(COUNTING, max_tokens=48, stream=True):
            parts.append(chunk.text)
        tick.cancel()
        return "".join(parts), start, seen

    text, start, seen = run(main())
    assert text == shared.create_completion(COUNTING, max_tokens=48).text
    during = {n for n in seen if start < n < start + 48}
    assert len(during) >= 12, sorted(during)  # the loop turned while a quarter or more of the tokens were made


def test_cancelling_the_task_frees_the_slot(shared):
    async def main():
        allama = lp.AsyncLlama(shared)
        before = shared.engine.stats.generated_tokens
        task = asyncio.create_task(allama.create_completion(COUNTING, max_tokens=3000))
        while shared.engine.stats.generated_tokens < before + 2:  # it runs
            await asyncio.sleep(0.01)
        assert shared.engine.stats.busy_slots == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await _busy_slots_drop_to_zero(shared)

    assert run(main())


def test_leaving_an_async_stream_frees_the_slot(shared):
    async def main():
        allama = lp.AsyncLlama(shared)
        stream = await allama.create_completion(COUNTING, max_tokens=3000, stream=True)
        async for _ in stream:
            break
        await stream.aclose()
        return await _busy_slots_drop_to_zero(shared)

    assert run(main())


def test_async_chat_streams_openai_chunks(shared):
    messages = [{"role": "user", "content": "Say hello."}]
    want = shared.create_chat_completion(messages, max_tokens=12).choices[0].message.content

    async def main():
        allama = lp.AsyncLlama(shared)
        chunks = [c async for c in await allama.create_chat_completion(messages, max_tokens=12, stream=True)]
        whole = await allama.create_chat_completion(messages, max_tokens=12)
        return chunks, whole

    chunks, whole = run(main())
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want == whole.choices[0].message.content


def test_bad_input_raises_at_the_await(shared):
    async def main():
        await lp.AsyncLlama(shared).create_completion("Hi", max_tokens=-1)

    with pytest.raises(lp.InvalidParameterError, match="max_tokens"):
        run(main())
