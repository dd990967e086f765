"""llama-server's LLAMA_SERVER_DEBUG_FAKE_TIMING, a debug knob of its router that its own test suite sets
(tools/server/tests/utils.py sets it for every server it starts): any non-empty value, read once at the start,
makes each model load and each request routed to a model take 2 s longer, so that the suite's router tests
(test_router.py's "server_lru_sched" ones) see requests queue behind a busy model and give up while queued.
Only a router (several models, --models-dir, --models-preset) reads it, as only llama-server's router does;
unset, nothing changes."""

from __future__ import annotations

import os

ENV = "LLAMA_SERVER_DEBUG_FAKE_TIMING"
DELAY = 2.0  # seconds, as the pin's server-models.cpp sleeps


def delay() -> float:
    """The seconds each load and each routed request wait first: DELAY with the variable set, else 0."""
    return DELAY if os.environ.get(ENV) else 0.0
