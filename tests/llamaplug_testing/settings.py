"""Where the repository is, and what every test shares: the thread count, the chat template of the tiny models."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
THREADS = 2
CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
