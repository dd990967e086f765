"""Generation as the native reference tools do it: greedy decoding by hand, and the pin's llama-completion."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .settings import THREADS


def greedy(model, ctx, n: int) -> list[int]:
    """n greedy tokens from the context's last logits, stopping at end of generation (as llama-mtmd-cli)."""
    import llamaplug as lp

    chain = lp.SamplerChain().greedy()
    out: list[int] = []
    for _ in range(n):
        token = chain.sample(ctx, -1)
        if model.token_is_eog(token):
            break
        out.append(token)
        ctx.decode_single(token)
    return out


def llama_completion(bin_dir: Path, model: Path, prompt: str, n: int, *flags: str, ctx: int = 2048) -> str:
    """The pin's llama-completion's text for `prompt` (not echoed), `n` tokens at most, with `flags`.

    It writes through common_log's worker thread and always ends with two blank lines of its own; once, in a
    whole-suite run, its stdout stopped one token and those lines short ('# 333.' where it always prints
    '# 333.3\\n\\n'): a cut output is the tool's, so it is asked again (three times at most) rather than compared.
    """
    for _ in range(3):
        done = subprocess.run(
            [str(bin_dir / "llama-completion"), "-m", str(model), "-p", prompt, "-n", str(n), "-no-cnv",
             "-t", str(THREADS), "-c", str(ctx), "--no-display-prompt", "--simple-io", "--no-warmup", *flags],
            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-2000:]
        if done.stdout.endswith("\n\n"):
            break
    return done.stdout
