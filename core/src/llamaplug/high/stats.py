"""The engine's counters (the server's /metrics, tests)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class EngineStats:
    """Counters for /metrics and tests (read without a lock: each is one int)."""

    requests: int = 0
    finished: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    stored_sequences: int = 0
    stored_bytes: int = 0
    cache_ram_hits: int = 0  # prompt cache lookups (disk_store.py's TieredStore counts them with a disk tier)
    cache_ram_misses: int = 0
    cache_disk_hits: int = 0
    cache_disk_misses: int = 0
    cache_disk_bytes: int = 0
    generated_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafts: int = 0  # drafts checked: one per sequence and decode with guesses (llama-server's n_draft_verif_steps)
    decode_steps: int = 0
    # llama-server's timing sums and decode shape (its /metrics): milliseconds reading prompts and generating (each
    # finished request's timings), sequences summed over decode steps, the most tokens one sequence held
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0
    busy_slot_steps: int = 0
    n_tokens_max: int = 0
    busy_slots: int = 0
    waiting: int = 0
