"""llamaplug sampler plugin: llguidance's constraints (JSON schema, Lark, llama.cpp's %llguidance GBNF) as a sampler.

    chain = llamaplug.SamplerChain().add("llguidance", model=llama.model, json_schema={...}).greedy()

The package is imported whenever the plugins load (every llamaplug process): llguidance and numpy are
imported when a chain first asks for the sampler.
"""

from __future__ import annotations

from typing import Any

from llamaplug import hookimpl


def llguidance(model: Any, json_schema: Any = None, lark: str | None = None, grammar: str | None = None) -> Any:
    """The factory registered as "llguidance": a sampler for `model` constrained by exactly one of a JSON schema
    (a dict or its JSON text), a Lark grammar, or GBNF (llama.cpp's, or `%llguidance` Lark)."""
    from .sampler import make_sampler

    return make_sampler(model, json_schema=json_schema, lark=lark, grammar=grammar)


@hookimpl
def llamaplug_register_samplers(register):
    register("llguidance", llguidance)
