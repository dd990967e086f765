"""ContextBuilder: seed 004's fluent way to make a LlamaContext.

    ctx = (ContextBuilder(model).context_size(4096).batch_size(512).threads(8)
           .embeddings(True).flash_attention(True).kv_cache_type(KvCacheType.Q8_0).build())

Each step validates at once (the same bounds as ContextParams); `kv_cache_type`
sets the K and the V cache types together.
"""

from __future__ import annotations

from typing import Any

from ..params import ContextParams, FlashAttnType, KvCacheType
from .context import LlamaContext
from .model import LlamaModel


class ContextBuilder:
    def __init__(self, model: LlamaModel, params: ContextParams | None = None):
        self.model = model
        self.params = params or ContextParams()

    def _set(self, **changes: Any) -> ContextBuilder:
        self.params = self.params.replace(**changes)
        return self

    def context_size(self, n: int) -> ContextBuilder:
        return self._set(n_ctx=n)

    def batch_size(self, n: int) -> ContextBuilder:
        return self._set(n_batch=n)

    def threads(self, n: int) -> ContextBuilder:
        return self._set(n_threads=n)

    def threads_batch(self, n: int) -> ContextBuilder:
        return self._set(n_threads_batch=n)

    def embeddings(self, enabled: bool) -> ContextBuilder:
        return self._set(embeddings=enabled)

    def flash_attention(self, enabled: bool) -> ContextBuilder:
        return self._set(flash_attn_type=FlashAttnType.ENABLED if enabled else FlashAttnType.DISABLED)

    def kv_cache_type(self, kind: KvCacheType | str) -> ContextBuilder:
        return self._set(type_k=kind, type_v=kind)

    def rope_freq_base(self, f: float) -> ContextBuilder:
        return self._set(rope_freq_base=f)

    def rope_freq_scale(self, f: float) -> ContextBuilder:
        return self._set(rope_freq_scale=f)

    def build(self) -> LlamaContext:
        return LlamaContext(self.model, self.params)
