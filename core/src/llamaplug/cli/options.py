"""What the commands read from their arguments: the chat template and settings, the request defaults, the
drafting parameters."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def chat_settings(args: argparse.Namespace) -> tuple[str | None, object]:
    """The chat template (--chat-template or --chat-template-file) and the server's ChatSettings."""
    from ..errors import InvalidParameterError
    from ..server.chat_settings import ChatSettings

    if args.chat_template is not None and args.chat_template_file is not None:
        raise InvalidParameterError("give --chat-template or --chat-template-file, not both",
                                    field="chat_template_file")
    template = args.chat_template
    if args.chat_template_file is not None:
        try:
            template = Path(args.chat_template_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidParameterError(f"--chat-template-file {args.chat_template_file}: {exc}",
                                        field="chat_template_file") from None
    thinking = {"on": True, "off": False}.get(args.reasoning)
    effort = None if args.reasoning_effort in (None, "default") else args.reasoning_effort
    return template, ChatSettings(args.reasoning_format, thinking, effort, args.chat_template_kwargs or {},
                                  args.reasoning_budget, args.reasoning_budget_message, jinja=args.jinja)


# llama-server's flags for the sampling of requests that do not set it: (flags, SamplerParams field, type).
REQUEST_DEFAULTS = [
    (("--temp", "--temperature"), "temperature", float), (("--top-k",), "top_k", int), (("--top-p",), "top_p", float),
    (("--min-p",), "min_p", float), (("--typical", "--typical-p"), "typical_p", float),
    (("--repeat-penalty",), "penalty_repeat", float), (("--repeat-last-n",), "penalty_last_n", int),
    (("--presence-penalty",), "penalty_present", float), (("--frequency-penalty",), "penalty_freq", float),
]


def request_defaults(args: argparse.Namespace) -> dict[str, object]:
    """The SamplerParams fields that --temp, --top-k, ... set (checked here: a bad one fails at startup)."""
    from ..params import SamplerParams

    given = {field: getattr(args, f"default_{field}") for _, field, _ in REQUEST_DEFAULTS
             if getattr(args, f"default_{field}") is not None}
    SamplerParams(**given)
    return given


# llama-server's --spec-type names we have a drafter for (and ours, "auto"), as LlamaParams.speculative.
_SPEC_TYPES = {"auto": "auto", "none": "none", "ngram-mod": "ngram-mod", "ngram-simple": "ngram-simple",
               "draft-simple": "draft-simple"}
_SPEC_TYPES_NOT_HERE = ("draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-map-k", "ngram-map-k4v",
                        "ngram-cache")


def model_fields(args: argparse.Namespace) -> dict[str, object]:
    """LlamaParams' fields from serve's flags (all but the log level): what `serve` gives each model it loads, and
    what a --models-preset section's flags give its own."""
    from ..errors import InvalidParameterError
    from ..params import ContextParams

    # As llama-server: -c is the whole KV cache, each slot holds c / parallel positions.
    base: dict[str, object] = {"n_ctx": args.ctx_size, "n_seq_max": args.parallel, "cache_ram_mib": args.cache_ram,
                               "n_gpu_layers": args.n_gpu_layers, "seed": args.seed,
                               "structured_engine": args.structured_engine, "kv_unified": args.kv_unified,
                               "context_shift": args.context_shift}
    if args.threads:
        base["n_threads"] = args.threads
    if args.cache_dir:
        # absolute: Ray replicas do not run in this directory
        base.update(cache_dir=os.path.abspath(args.cache_dir), cache_disk_mib=args.cache_disk_mib)
    if args.rpc:
        base["rpc_servers"] = [e.strip() for given in args.rpc for e in given.split(",") if e.strip()]
    if args.n_batch:
        base["n_batch"] = args.n_batch
    if args.n_ubatch:
        # refused rather than clamped to n_batch as llama.cpp would: nothing given is silently changed
        n_batch = args.n_batch or ContextParams.model_fields["n_batch"].default
        if args.n_ubatch > n_batch:
            raise InvalidParameterError(f"-ub {args.n_ubatch} is more than -b {n_batch} (n_batch): a physical batch "
                                        "is at most the logical one; lower -ub or raise -b", field="n_ubatch")
        base["n_ubatch"] = args.n_ubatch
    if args.cache_exact:
        base["cache_exact"] = True
    if args.flash_attn:
        base["flash_attn_type"] = args.flash_attn
    base.update(draft_params(args))
    return base


def draft_params(args: argparse.Namespace) -> dict[str, object]:
    """LlamaParams' drafting fields from --spec-type and the --spec-*/--draft-* flags: with neither --spec-type,
    --spec nor -md, "auto" (drafting with no second model where the reply copies)."""
    from ..errors import InvalidParameterError

    kind = spec_type(args.spec_type) if args.spec_type is not None else None
    if args.spec is not None:
        if kind not in (None, "ngram-simple"):
            raise InvalidParameterError(f"--spec {args.spec} and --spec-type {args.spec_type} ask for two ways to "
                                        "draft: give one", field="spec_type")
        kind = "ngram-simple"
    if args.draft_model and kind not in (None, "draft-simple"):
        raise InvalidParameterError(f"-md {args.draft_model} asks for a draft model and --spec-type {kind} for "
                                    "none: give one of them", field="spec_type")
    if kind == "draft-simple" and not args.draft_model:
        raise InvalidParameterError("--spec-type draft-simple needs a draft model: -md FILE", field="draft_model")
    given: dict[str, object] = {"draft_model_path": args.draft_model,
                                "speculative": None if args.draft_model else kind or "auto",
                                "draft_max": args.draft_max, "draft_min": args.draft_min,
                                "draft_p_min": args.draft_p_min}
    if not args.draft_model:  # the n-gram drafters' own settings
        given.update(ngram_size=args.ngram_size, ngram_mod_n_match=args.ngram_mod_n_match,
                     ngram_mod_n_min=args.ngram_mod_n_min, ngram_mod_n_max=args.ngram_mod_n_max)
    rates, length = getattr(args, "draft_synth_rates", None), getattr(args, "draft_synth_len", None)
    if rates is not None or length is not None:
        given.update(draft_synth_rates=rates, draft_synth_len=length)
        _check_synth(given)
    return given


def _check_synth(given: dict[str, object]) -> None:
    """--spec-synth-rates / --spec-synth-len checked against the drafter's most tokens per step (as llama-server
    does when its drafter starts), before any model loads: an error naming the flag."""
    from ..errors import InvalidParameterError
    from ..high.speculative import synth_rates
    from ..params import LlamaParams

    drafted = LlamaParams.model_construct(**given).drafted_max()
    try:
        synth_rates(given["draft_synth_rates"], given["draft_synth_len"], drafted)  # type: ignore[arg-type]
    except InvalidParameterError as exc:
        flag = "--spec-synth-rates" if exc.field == "draft_synth_rates" else "--spec-synth-len"
        raise InvalidParameterError(f"{flag}: {exc}", field=exc.field) from None


def spec_type(value: str) -> str:
    """--spec-type's value (llama-server's comma-separated list: one type here) as LlamaParams.speculative."""
    from ..errors import InvalidParameterError

    names = [v.strip() for v in value.split(",") if v.strip()]
    if len(names) != 1:
        raise InvalidParameterError(f"--spec-type {value!r}: give one type (llama-server's combinations are not "
                                    f"implemented here): one of {', '.join(_SPEC_TYPES)}", field="spec_type")
    name = names[0]
    if name in _SPEC_TYPES_NOT_HERE:
        raise InvalidParameterError(f"--spec-type {name} is a llama-server type `llamaplug` does not implement "
                                    f"(it has: {', '.join(_SPEC_TYPES)})", field="spec_type")
    if name not in _SPEC_TYPES:
        raise InvalidParameterError(f"--spec-type {name!r} is not a type of speculative decoding: one of "
                                    f"{', '.join(_SPEC_TYPES)}", field="spec_type")
    return _SPEC_TYPES[name]
