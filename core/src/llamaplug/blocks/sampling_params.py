"""The chain llama.cpp's common sampler builds for a SamplerParams (common/sampling.cpp of the pin).

The policy (which samplers, in which order, from which fields) apart from the samplers
themselves (sampling.py): it appends to a chain it is given, so it needs nothing of
sampling.py at run time, and SamplerChain.from_params uses it without an import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..params import SamplerParams

if TYPE_CHECKING:
    from .sampling import SamplerChain


def add_common_samplers(chain: SamplerChain, params: SamplerParams) -> SamplerChain:
    """Append llama.cpp's common chain for `params` to `chain` (a new, empty one) and return it.

    grammar, logit bias, then `params.samplers` in order (mirostat replaces them), then
    dist (or adaptive_p when listed); temperature <= 0 ends in greedy instead.
    """
    if params.grammar:
        chain.grammar(params.grammar)
    if params.logit_bias:
        chain.logit_bias(params.logit_bias)
    if params.mirostat:
        chain.temp(params.temperature)
        if params.mirostat == 1:
            return chain.mirostat(params.mirostat_tau, params.mirostat_eta, 100)
        return chain.mirostat_v2(params.mirostat_tau, params.mirostat_eta)
    greedy = params.temperature <= 0
    steps = {
        "penalties": lambda: chain.penalties(params.penalty_last_n, params.penalty_repeat, params.penalty_freq,
                                             params.penalty_present),
        "dry": lambda: chain.dry(params.dry_multiplier, params.dry_base, params.dry_allowed_length,
                                 params.dry_penalty_last_n, params.dry_sequence_breakers),
        "top_n_sigma": lambda: chain.top_n_sigma(params.top_n_sigma),
        "top_k": lambda: chain.top_k(params.top_k),
        "typical_p": lambda: chain.typical(params.typical_p, params.min_keep),
        "top_p": lambda: chain.top_p(params.top_p, params.min_keep),
        "min_p": lambda: chain.min_p(params.min_p, params.min_keep),
        "xtc": lambda: chain.xtc(params.xtc_probability, params.xtc_threshold, params.min_keep),
        "temperature": lambda: chain.temp_ext(params.temperature, params.dynatemp_range, params.dynatemp_exponent),
        "infill": lambda: chain.infill(),
    }
    for name in params.samplers:
        if name == "adaptive_p" or (greedy and name == "temperature"):
            continue  # llama.cpp's temperature 0 keeps the most likely token: greedy below
        steps[name]()
    if greedy:
        return chain.greedy()
    if "adaptive_p" in params.samplers:
        return chain.adaptive_p(params.adaptive_target, params.adaptive_decay)
    return chain.dist()
