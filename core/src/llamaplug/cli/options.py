"""What the commands read from their arguments: the chat template and settings, the request defaults, the
drafting parameters."""

from __future__ import annotations

import argparse
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
                                  args.reasoning_budget, args.reasoning_budget_message)


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


def draft_params(args: argparse.Namespace) -> dict[str, object]:
    return {"draft_model_path": args.draft_model, "speculative": args.spec, "draft_max": args.draft_max,
            "draft_min": args.draft_min, "draft_p_min": args.draft_p_min}
