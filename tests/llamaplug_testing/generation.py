"""Greedy decoding by hand, as the native reference tools do it."""

from __future__ import annotations


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
