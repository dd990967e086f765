"""Example sampler plugin: Python samplers that run inside llama.cpp's sampler chain.

    chain = llamaplug.SamplerChain().add("ban", tokens=[13, 198]).top_k(40).dist(1)
"""

from __future__ import annotations

from llamaplug import hookimpl

# The plugin's package is imported whenever the plugins load (every `llamaplug` command does): the factories
# import the samplers and numpy only when a chain asks for one.


def ban(tokens):
    from .samplers import Ban

    return Ban(tokens)


def argmax():
    from .samplers import Argmax

    return Argmax()


def noop():
    from .samplers import Noop

    return Noop()


def explode(times=1):
    from .samplers import Explode

    return Explode(times)


@hookimpl
def llamaplug_register_samplers(register):
    register("ban", ban)
    register("argmax", argmax)
    register("noop", noop)
    register("explode", explode)
