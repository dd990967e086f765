"""Where the repository is, and what every test shares: the thread count, the chat template of the tiny models."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Two compute threads, or one a worker where pytest-xdist runs tests side by side (`make test` on CI's 2 cores):
# ggml's threads spin while they wait, and four of them on two cores slow every decode down.
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2
CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
