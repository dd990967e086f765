"""llama-cpp-python's LlamaState: what Llama.save_state returns and load_state takes."""

from __future__ import annotations

import numpy as np


class LlamaState:
    """A saved state: `llama_state` is llamaplug's (the KV cache and slots, tied to the model), `seed` the
    Llama's seed then, `input_ids[:n_tokens]` the tokens of the last generation. `scores` is empty:
    llamaplug keeps no logits of past tokens."""

    def __init__(self, input_ids: np.ndarray, scores: np.ndarray, n_tokens: int, llama_state: bytes,
                 llama_state_size: int, seed: int):
        self.input_ids = input_ids
        self.scores = scores
        self.n_tokens = n_tokens
        self.llama_state = llama_state
        self.llama_state_size = llama_state_size
        self.seed = seed
