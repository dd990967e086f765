"""`max_queue` (Ollama's OLLAMA_MAX_QUEUE): a request that would be the N+1th waiting (for a model's load, or for a
slot of its model) is refused with a 503 and Retry-After (`QueueFullError`) instead of queueing."""

from __future__ import annotations

from ..errors import InvalidParameterError
from .api_error import QueueFullError

DEFAULT_MAX_QUEUE = 512  # as Ollama's OLLAMA_MAX_QUEUE


class QueueLimit:
    """The requests that may wait at once; `loading` counts those waiting for a load or an unload (the registry's
    to keep), the models' engines count theirs."""

    def __init__(self, max_queue: int = DEFAULT_MAX_QUEUE):
        if max_queue < 1:
            raise InvalidParameterError(f"max_queue (--max-queue) must be at least 1, not {max_queue}",
                                        field="max_queue")
        self.max_queue = max_queue
        self.loading = 0

    def check(self, in_engines: int) -> None:
        """Refuse one more request that would wait, where `in_engines` wait in the engines and `loading` for
        loads already fill the queue."""
        waiting = self.loading + in_engines
        if waiting >= self.max_queue:
            raise QueueFullError(f"the server is busy: {waiting} requests are waiting (--max-queue {self.max_queue});"
                                 " retry later", headers={"Retry-After": "1"})
