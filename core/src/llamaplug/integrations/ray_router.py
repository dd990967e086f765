"""The Ray Serve request router of the llamaplug replicas: prefix affinity by consistent hashing, or round robin.

Ray 2.60's own prefix-aware router (`ray.serve.llm.request_router.PrefixCacheAffinityRouter`)
was read and not used: it lives in `ray.llm` (the vLLM stack's package), keeps a prefix
tree in an extra detached actor that it queries with blocking `ray.get` calls inside the
router's event loop, and by default never falls back on load. This router needs no
actor: a request's key (affinity.py, computed by the ingress and passed as the
`affinity` keyword) names one replica on a ring of the live replicas, ranked first;
the others follow as the fallback rank, where Serve takes the least loaded one when
the first is saturated (its ongoing requests at `max_ongoing_requests`, the slots).
A `replica` keyword pins a request to one replica (per-replica /metrics, debugging).

No FIFOMixin: with it, a replica found for one request may be handed to another
waiting request, which would undo the affinity.
"""

from __future__ import annotations

import itertools
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from .affinity import HashRing

MODES = ("prefix", "round_robin")


class PrefixAffinityRouter(RequestRouter):
    def initialize_state(self, mode: str = "prefix", **_: Any) -> None:
        if mode not in MODES:
            raise ValueError(f"routing mode {mode!r}: one of {', '.join(MODES)}")
        self._mode = mode
        self._ring = HashRing(())
        self._turns = itertools.count()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        kwargs = pending_request.kwargs if pending_request is not None else {}
        pinned = kwargs.get("replica")
        if pinned:
            return [[by_id[pinned]]] if pinned in by_id else []  # Serve retries (backoff) until it is back
        first: str | None = None
        if self._mode == "round_robin" and by_id:
            names = sorted(by_id)
            first = names[next(self._turns) % len(names)]
        elif kwargs.get("affinity"):
            if self._ring.names != by_id.keys():
                self._ring = HashRing(by_id)
            first = self._ring.owner(kwargs["affinity"])
        if first is None:
            return [candidate_replicas]
        return [[by_id[first]], [r for name, r in by_id.items() if name != first]]
