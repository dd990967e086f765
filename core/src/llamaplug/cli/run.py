"""`llamaplug run` (as `ollama run`: a reply to one prompt, or a conversation; `--raw` or a model without a chat
template: a completion streamed) and `llamaplug chat` (a conversation in the terminal)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from .options import draft_params

if TYPE_CHECKING:
    from ..high.llama import Llama
    from ..params import SamplerParams


def model_path(model: str) -> str | Path:
    """The file a model's name names (high/names.py: a path, a catalog name, "org/repo[:TAG]" from the Hub
    cache or downloaded)."""
    from ..high import names

    return names.resolve(model)


def _names_a_model(text: str) -> bool:
    """Whether `run`'s one word names a model (`llamaplug run MODEL`: a chat) rather than being a prompt."""
    from ..high import names

    if Path(text).is_file() or text.lower().endswith(".gguf"):
        return True
    return names.hub_ref(text) is not None or names.is_catalog_name(text)


@contextlib.contextmanager
def closing(llama: Llama) -> Iterator[Llama]:
    """`llama`, closed on the way out, Ctrl-C too: the engine's thread stops before the interpreter does.

    Closing waits for that thread (a decode running stops at its next graph node: well under a second). A
    second Ctrl-C meanwhile would raise in the wait and leave the interpreter to exit with the thread still
    decoding in the model it frees: from here on, Ctrl-C ends the process at once (SIGINT's default, as a
    shell expects of a program it interrupts; it reports 130), before anything is freed.
    """
    try:
        yield llama
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        llama.close()


def run_model_and_prompt(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(MODEL or None: the default, PROMPT or None: a conversation) from `run`'s words, as `ollama run` reads
    them: MODEL PROMPT, MODEL alone, or PROMPT alone (then MODEL is -m, -hf, --catalog or the default)."""
    from ..errors import InvalidParameterError

    words = list(args.prompt)
    given = [m for m in (args.model, args.hf_repo) if m]
    if len(given) > 1:
        raise InvalidParameterError("give -m MODEL or -hf org/repo[:TAG], not both", field="model")
    if len(words) > 2 or (len(words) == 2 and given):
        raise InvalidParameterError("`llamaplug run` takes [MODEL] [PROMPT] (or -m MODEL PROMPT); quote the prompt",
                                    field="prompt")
    if len(words) == 2:
        return words[0], words[1]
    if len(words) == 1 and not given and _names_a_model(words[0]):
        return words[0], None
    return (given[0] if given else None), (words[0] if words else None)


def cmd_run(args: argparse.Namespace) -> int:
    from ..catalog import default_model
    from ..errors import InvalidParameterError
    from ..high.llama import Llama
    from ..params import LlamaParams, SamplerParams

    model, prompt = run_model_and_prompt(args)
    if prompt is None and not sys.stdin.isatty():  # `echo hi | llamaplug run MODEL`: stdin is the prompt, as Ollama
        prompt = sys.stdin.read()
        if not prompt.strip():
            raise InvalidParameterError("no prompt: stdin was empty (give PROMPT, or run it in a terminal to chat)",
                                        field="prompt")
    if prompt is None and args.raw:
        raise InvalidParameterError("--raw takes a PROMPT (a completion of it)", field="raw")
    path = model_path(model) if model else default_model(args.catalog)
    extra: dict[str, object] = {"n_threads": args.threads} if args.threads else {}
    if args.devices:
        extra["devices"] = [] if args.devices == ["none"] else args.devices
    llama = Llama.load(LlamaParams(model_path=path, n_ctx=args.ctx_size, log_level=args.log, rpc_servers=args.rpc,
                                   n_gpu_layers=args.n_gpu_layers, **extra, **draft_params(args)))
    sampling = SamplerParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                             penalty_repeat=args.repeat_penalty, seed=args.seed)
    with closing(llama):
        if args.raw or llama.model.chat_template is None:
            return _complete(llama, prompt or "", sampling, args)
        limit = None if args.n_predict is None or args.n_predict < 0 else args.n_predict
        chat_sampling = {"sampler": sampling, "stop": args.stop or None}
        if prompt is None:  # `ollama run MODEL`: a conversation
            from ..chat_repl import repl

            return repl(llama, chat_sampling, limit, args.system)
        from ..chat_repl import ReasoningPrinter, stream_reply

        printer = ReasoningPrinter(sys.stdout, dim=sys.stdout.isatty())
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
            [{"role": "user", "content": prompt}]
        try:
            stream_reply(llama, messages, limit, chat_sampling, printer)
        finally:
            printer.finish()
    return 0


def _complete(llama: Llama, prompt: str, sampling: SamplerParams, args: argparse.Namespace) -> int:
    """`run --raw` (and a model without a chat template): the prompt and its continuation, streamed."""
    sys.stdout.write(prompt)
    final = None
    # the job owns the chain it builds from `sampling`: a Ctrl-C cannot free it under a decode still sampling
    stream = llama.create_completion(prompt, max_tokens=64 if args.n_predict is None else args.n_predict,
                                     sampler=sampling, stop=args.stop, stream=True)
    try:
        for chunk in stream:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            final = chunk
    finally:  # Ctrl-C too: the generation cancelled, the shell's prompt on a line of its own
        stream.close()
        sys.stdout.write("\n")
    if final is not None and final.timings is not None and args.timings:
        t = final.timings
        print(f"[{final.stop_reason.value}] prompt {t.prompt_tokens} tokens {t.prompt_per_second:.1f} t/s, "
              f"generated {t.predicted_tokens} tokens {t.predicted_per_second:.1f} t/s"
              + (f", drafted {t.drafted_tokens} accepted {t.accepted_tokens}" if t.drafted_tokens else ""),
              file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from ..catalog import default_model
    from ..chat_repl import repl
    from ..high.llama import Llama

    model = args.model_arg or args.model or getattr(args, "hf_repo", None)
    path = model_path(model) if model else default_model(args.catalog)
    extra: dict[str, object] = {"n_threads": args.threads} if args.threads else {}
    mcp = _mcp_chat(args)  # before the model loads: a bad config or server fails fast
    with closing(Llama.load(path, n_ctx=args.ctx_size, log_level=args.log, n_gpu_layers=args.n_gpu_layers, **extra,
                            **draft_params(args))) as llama:
        sampling: dict[str, object] = {"temperature": args.temp, "top_k": args.top_k, "top_p": args.top_p,
                                       "min_p": args.min_p, "repeat_penalty": args.repeat_penalty, "seed": args.seed}
        if args.chat_template is not None:
            sampling["chat_template"] = args.chat_template
        return repl(llama, sampling, None if args.n_predict < 0 else args.n_predict, args.system, mcp=mcp)


def _mcp_chat(args: argparse.Namespace) -> object | None:
    """chat's MCP tools (--mcp-config), listed once; None without a config."""
    from ..errors import InvalidParameterError

    if args.mcp_config is None:
        if args.tool_choice is not None:
            raise InvalidParameterError("--tool-choice is for MCP tools: give --mcp-config FILE", field="tool_choice")
        return None
    import asyncio

    from ..chat_mcp import McpChat
    from ..high.mcp_tools import McpTools

    tools = asyncio.run(McpTools.from_config(args.mcp_config).start())
    choice: str | dict[str, object] | None = args.tool_choice
    if choice not in (None, "auto", "required", "none"):
        if choice not in tools.tools:
            raise InvalidParameterError(f"--tool-choice {choice}: no such MCP tool (one of auto, required, none, "
                                        f"{', '.join(tools.tools)})", field="tool_choice")
        choice = {"type": "function", "function": {"name": choice}}
    return McpChat(tools, choice, args.mcp_max_steps, args.mcp_timeout)
