"""Load progress (a callback, a bar on a terminal), cancelling a load, cancelling a generation from another thread."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from llamaplug_testing import THREADS, run_isolated

import llamaplug as lp


def test_the_progress_callback_rises_to_one(smollm2_path):
    seen: list[float] = []
    with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=256, n_threads=THREADS,
                                      progress_callback=seen.append)) as llama:
        assert llama.create_completion("Hi", 2).tokens
    assert seen and seen == sorted(seen) and seen[-1] == 1.0 and seen[0] < 1.0


def test_returning_false_cancels_the_load_cleanly(smollm2_path):
    calls = []

    def stop_halfway(progress: float) -> bool:
        calls.append(progress)
        return progress < 0.5

    with pytest.raises(lp.LoadCancelledError, match="cancelled by the progress callback"):
        lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=256, n_threads=THREADS, progress_callback=stop_halfway))
    assert calls and calls[-1] >= 0.5
    with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=256, n_threads=THREADS)) as again:  # nothing left behind
        assert again.create_completion("Hi", 2).tokens


def test_an_exception_in_the_callback_stops_the_load_and_surfaces(smollm2_path):
    def boom(progress: float) -> None:
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=256, n_threads=THREADS, progress_callback=boom))


def test_a_progress_bar_when_asked(smollm2_path):
    code = f"""
import llamaplug as lp
llama = lp.Llama.load(lp.LlamaParams({str(smollm2_path)!r}, n_ctx=256, n_threads={THREADS}, progress=True))
print(llama.create_completion("Hi", 2).tokens)
"""
    done = run_isolated(code)
    assert done.returncode == 0, done.stderr
    assert "loading SmolLM2" in done.stderr and "100" in done.stderr


def _cancel_at(llama, n_chunks: int) -> tuple[threading.Event, threading.Thread]:
    """A thread that cancels `llama`'s generations once the consumer sets the event (at its `n_chunks`-th chunk):
    the cancel comes from another thread at a point counted in chunks, not in seconds."""
    reached = threading.Event()

    def cancel() -> None:
        assert reached.wait(120)
        llama.cancel()

    thread = threading.Thread(target=cancel)
    thread.start()
    return reached, thread


def test_cancel_from_another_thread_stops_within_a_step(llama):
    uncancelled = llama.create_completion("Once upon a time", max_tokens=64)
    assert uncancelled.stop_reason == lp.StopReason.MAX_TOKENS  # greedy: the same run would go on to 64
    reached, canceller = _cancel_at(llama, 5)
    seen = []
    for chunk in llama.create_completion("Once upon a time", max_tokens=64, stream=True):
        seen.append(chunk)
        if len(seen) == 5:
            reached.set()
            canceller.join()  # the cancel is in before the next chunk is asked for
    final = seen[-1]
    assert final.stop_reason == lp.StopReason.CANCELLED
    assert final.timings.predicted_tokens <= 6  # the tokens of 5 chunks, and at most the step under way
    # Usable afterwards; a cancel before a generation does not stop the next one.
    llama.cancel()
    assert llama.create_completion("Hi", 4).stop_reason == lp.StopReason.MAX_TOKENS


def test_chat_maps_a_cancel_to_stop(llama):
    # A cancel and an end of text both finish as "stop": the cancel must have cut a reply that, left alone,
    # goes on (greedy, the same reply each time).
    messages = [{"role": "user", "content": "Tell a long story."}]
    whole = llama.create_chat_completion(messages, max_tokens=64)
    assert whole.choices[0].finish_reason == "length"
    reached, canceller = _cancel_at(llama, 4)
    chunks = []
    for chunk in llama.create_chat_completion(messages, max_tokens=64, stream=True):
        chunks.append(chunk)
        if len(chunks) == 4:
            reached.set()
            canceller.join()
    assert chunks[-1].choices[0].finish_reason == "stop"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert len(text) < len(whole.choices[0].message.content)


def _when_decoding(call: object, then: object) -> threading.Thread:
    """A thread that calls `then()` once some other thread is inside `call` (a Python function wrapping a C call
    that releases the GIL): the moment is an event seen in the stacks, not a time. The deadline only ends a hang."""
    code = call.__code__

    def inside() -> bool:
        for ident, frame in sys._current_frames().items():
            while ident != threading.get_ident() and frame is not None:
                if frame.f_code is code:
                    return True
                frame = frame.f_back
        return False

    def watch() -> None:
        deadline = time.monotonic() + 120
        while not inside():
            assert time.monotonic() < deadline, "the decode never started"
            time.sleep(0.0005)
        then()

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def test_cancel_aborts_a_running_decode(smollm2_path):
    """The prompt is read in one llama_decode; a cancel stops it between graph nodes, not after it."""
    with lp.Llama.load(lp.LlamaParams(smollm2_path, n_ctx=2048, n_batch=2048, n_ubatch=2048,
                                      n_threads=THREADS)) as llama:
        prompt = llama.tokenize("The history of the world, told slowly. " * 200)[:1900]
        whole = llama.create_completion(prompt, max_tokens=1)
        assert whole.stop_reason == lp.StopReason.MAX_TOKENS
        llama.context.clear_cache()  # the engine notices: the next run reads the prompt again
        steps = llama.engine.stats.decode_steps
        canceller = _when_decoding(lp.LlamaContext.decode, llama.cancel)
        out = llama.create_completion(prompt, max_tokens=1)
        canceller.join()
        assert out.stop_reason == lp.StopReason.CANCELLED and out.tokens == []
        # No decode ran to its end (a cancel seen only after it would count one step and give the token).
        assert llama.engine.stats.decode_steps == steps
        # The aborted decode's cells were dropped: the same prompt now gives the same token as before.
        assert llama.create_completion(prompt, max_tokens=1).tokens == whole.tokens
