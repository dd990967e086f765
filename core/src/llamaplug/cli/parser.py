"""The command line: each command's flags, and the commands plugins add (hook llamaplug_register_commands)."""

from __future__ import annotations

import argparse
import json
import logging

from .. import __version__
from ..errors import LlamaError, TokenizerError
from ..server.builtin_tools import NAMES as BUILTIN_TOOLS
from .gguf import INSPECT_JSON, cmd_inspect, cmd_quantize
from .info import cmd_info
from .options import REQUEST_DEFAULTS, spec_type
from .run import cmd_chat, cmd_run
from .serve import cmd_rpc_server, cmd_serve

log = logging.getLogger("llamaplug.cli")


def _add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    """llama-server's chat-layer flags, with its meanings (`llama-server --help` of the pin)."""
    parser.add_argument("--chat-template", metavar="JINJA_TEMPLATE",
                        help="the chat template of the -m models: Jinja text, or a name of llama.cpp's built-in "
                             "templates (default: the GGUF's own)")
    parser.add_argument("--chat-template-file", metavar="FILE", help="the chat template, read from FILE")
    parser.add_argument("--jinja", action=argparse.BooleanOptionalAction, default=True,
                        help="render chat templates with llama.cpp's Jinja engine (default); --no-jinja: its "
                             "built-in template of the same family, as llama-server's, which refuses tools")
    parser.add_argument("--chat-template-kwargs", metavar="JSON", type=_json_object,
                        help='extra template variables for every request, e.g. \'{"enable_thinking": false}\'')
    parser.add_argument("--reasoning-format", choices=["none", "auto", "deepseek", "deepseek-legacy"],
                        help="where thinking goes: none keeps it in content; auto / deepseek put it in "
                             "reasoning_content; deepseek-legacy keeps <think> tags in content too (default: auto)")
    parser.add_argument("-rea", "--reasoning", choices=["on", "off", "auto"], default="auto",
                        help="thinking on or off for templates that can switch it (default: auto, the template's)")
    parser.add_argument("--reasoning-effort", metavar="LEVEL",
                        help="reasoning_effort given to the template ('default' keeps the template's)")
    parser.add_argument("--reasoning-budget", metavar="N", type=_budget, default=-1,
                        help="token budget for thinking: -1 for unrestricted, 0 for immediate end, N>0 for token "
                             "budget (default: -1); a request's reasoning_budget_tokens wins")
    parser.add_argument("--reasoning-budget-message", metavar="MESSAGE",
                        help="message injected before the end-of-thinking tag when reasoning budget is exhausted "
                             "(default: none)")


def _budget(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (unrestricted), 0 or more, got {value}")
    return value


def _json_object(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """llama.cpp's sampling flags and defaults (SamplerParams'), for `run` and `chat`."""
    parser.add_argument("--temp", type=float, default=0.8, help="temperature (default 0.8; 0 = greedy)")
    parser.add_argument("--top-k", type=int, default=40, help="default 40; 0 = off")
    parser.add_argument("--top-p", type=float, default=0.95, help="default 0.95; 1.0 = off")
    parser.add_argument("--min-p", type=float, default=0.05, help="default 0.05; 0.0 = off")
    parser.add_argument("--repeat-penalty", type=float, default=1.0, help="default 1.0 = off")
    parser.add_argument("-s", "--seed", type=int, default=0xFFFFFFFF, help="default: random")


def _add_request_defaults(serve: argparse.ArgumentParser) -> None:
    for flags, field, kind in REQUEST_DEFAULTS:
        serve.add_argument(*flags, dest=f"default_{field}", type=kind, metavar="X",
                           help=f"{field} of requests that do not give one (llama-server's default otherwise)")


def _add_draft_arguments(parser: argparse.ArgumentParser) -> None:
    """Speculative decoding (LlamaParams.speculative, draft_*, ngram_*), for `run`, `chat` and `serve`: llama-server's
    --spec-* flags with its meanings, and ours. Drafting with no second model is on unless --spec-type none."""
    parser.add_argument("-md", "--draft-model", "--spec-draft-model", "--model-draft", dest="draft_model",
                        help="a small GGUF of the same vocabulary that drafts tokens")
    parser.add_argument("--spec-type", metavar="TYPE", default=None, type=_spec_type,
                        help="how to draft: auto (default: the reply's copies of its prompt, earlier turns or other "
                             "requests, adapted per request; no second model), none (off: greedy text is "
                             "llama-completion's exactly), ngram-mod, ngram-simple (llama-server's), draft-simple "
                             "(with -md); llama-server's other types are refused")
    parser.add_argument("--spec", choices=["ngram"], help="the same as --spec-type ngram-simple")
    parser.add_argument("--draft-max", "--spec-draft-n-max", "--spec-ngram-simple-size-m", dest="draft_max", type=int,
                        default=16, help="the most tokens a draft model or ngram-simple drafts per step (default 16)")
    parser.add_argument("--draft-min", "--spec-draft-n-min", dest="draft_min", type=int, default=0,
                        help="drop a draft model's shorter drafts (default 0)")
    parser.add_argument("--draft-p-min", "--spec-draft-p-min", dest="draft_p_min", type=float, default=0.0,
                        help="a draft model stops drafting below this probability (default 0)")
    parser.add_argument("--spec-ngram-simple-size-n", dest="ngram_size", type=int, default=12, metavar="N",
                        help="ngram-simple: tokens looked up (default 12)")
    # Not given: ngram-mod takes llama-server's defaults, auto chooses from the measured cost of a drafted row.
    parser.add_argument("--spec-ngram-mod-n-match", dest="ngram_mod_n_match", type=int, default=None, metavar="N",
                        help="auto, ngram-mod: the tokens an n-gram has (default 24; auto: 12 or 24 by the measured "
                             "cost of a drafted row)")
    parser.add_argument("--spec-ngram-mod-n-min", dest="ngram_mod_n_min", type=int, default=None, metavar="N",
                        help="auto, ngram-mod: shorter drafts are dropped (default 48; auto: 24 or 48, as n-match)")
    parser.add_argument("--spec-ngram-mod-n-max", dest="ngram_mod_n_max", type=int, default=None, metavar="N",
                        help="auto, ngram-mod: the most tokens drafted per step (default 64; auto: 32 or 64, as "
                             "n-match)")
    # llama-server's benchmarking mode: checked against the drafter's most tokens per step by draft_params.
    parser.add_argument("--spec-synth-rates", dest="draft_synth_rates", type=_synth_rates, default=None,
                        metavar="P0,P1,...",
                        help="benchmarking only: accept each draft position's guess at random at these "
                             "unconditional rates (one per drafted token, non-increasing, in [0, 1]), whatever the "
                             "model samples; the output is not valid")
    parser.add_argument("--spec-synth-len", dest="draft_synth_len", type=_synth_len, default=None, metavar="L",
                        help="benchmarking only: as --spec-synth-rates, the rates that give this mean accepted "
                             "length (the model's token included)")


def _synth_rates(text: str) -> list[float]:
    """--spec-synth-rates' numbers, as llama-server reads them (each stripped, wholly a number)."""
    try:
        return [float(part.strip()) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("invalid value") from None


def _synth_len(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("invalid value") from None
    if value == -1.0:  # llama-server's "not given"
        raise argparse.ArgumentTypeError("invalid value")
    return value


def _spec_type(text: str) -> str:
    """--spec-type's value checked as the parser reads it: a bad one is a usage error, as a bad choice is."""
    try:
        return spec_type(text)
    except LlamaError as exc:  # (InvalidParameterError)
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _builtin_tools(text: str) -> list[str]:
    """llama-server's --tools: a comma list of the built-in tools' names, "all" for every one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name != "all" and name not in BUILTIN_TOOLS:
            raise argparse.ArgumentTypeError(f'unknown tool "{name}". available tools: {", ".join(BUILTIN_TOOLS)}')
    return list(BUILTIN_TOOLS) if "all" in names else [n for n in BUILTIN_TOOLS if n in names]


def _lora_files(text: str) -> list[tuple[str, float]]:
    """--lora FNAME[,FNAME...]: each at scale 1 (llama-server's comma list)."""
    return [(item.strip(), 1.0) for item in text.split(",") if item.strip()]


def _lora_scaled(text: str) -> list[tuple[str, float]]:
    """--lora-scaled FNAME:SCALE[,FNAME:SCALE...], as llama-server splits it (one ':' in each item)."""
    import math

    given = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            scale = float(parts[1])
        except ValueError:
            raise argparse.ArgumentTypeError(f"lora-scaled format: FNAME:SCALE, got {item!r}") from None
        if not math.isfinite(scale):
            raise argparse.ArgumentTypeError(f"a LoRA scale is a finite number, got {parts[1]!r} in {item!r}")
        given.append((parts[0], scale))
    return given


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535; 0: any free one)")
    return int(text)


def _api_key(text: str) -> str:
    if not text.strip():  # an empty key would turn authentication off, which is never what giving one means
        raise argparse.ArgumentTypeError("the key is empty (leave --api-key out to serve without one)")
    return text


def _seconds(text: str) -> float:
    """A --keep-alive/--sleep-idle value: seconds, or a duration as "5m", "1h30m"."""
    from ..server.durations import seconds

    try:
        return seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: a flag it does not know is its error, with its usage (argparse leaves unknown flags
    to the top-level parser, whose usage says nothing of the command's flags)."""

    # `serve` reads `--a_b` as `--a-b`, as llama-server's parser (common/arg.cpp) reads every flag
    underscores_as_dashes = False

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def,override]
        if args is not None and self.underscores_as_dashes:
            args = [_dashed(a) for a in args]
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def _dashed(arg: str) -> str:
    if not arg.startswith("--"):
        return arg
    name, eq, value = arg.partition("=")
    return name.replace("_", "-") + eq + value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llamaplug", description="GGUF models on llama.cpp")
    p.add_argument("--version", action="version", version=f"llamaplug {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    info = sub.add_parser("info", help="versions, backend plugins with probe verdicts, devices, models")
    info.add_argument("--mmproj", help="a multimodal projector GGUF: say whether it takes images and audio")
    info.set_defaults(func=cmd_info)
    run = sub.add_parser("run", help="reply to a prompt, or chat, as `ollama run` (--raw: stream a completion)",
                         description="As `ollama run`: MODEL PROMPT replies to the prompt through the model's chat "
                                     "template; MODEL alone opens a conversation (stdin, when piped, is the prompt); "
                                     "PROMPT alone uses -m or the default model. --raw, or a model without a chat "
                                     "template: the prompt and its completion.")
    run.add_argument("prompt", nargs="*", metavar="[MODEL] [PROMPT]",
                     help='MODEL: a GGUF file, a catalog name (`llamaplug list`) or a Hugging Face repo '
                          '"org/repo[:TAG]" (TAG: Q4_K_M, Q8_0, ...; from its cache, else downloaded)')
    run.add_argument("-m", "--model", help="the same as MODEL (default: the first installed catalog model)")
    run.add_argument("-hf", "-hfr", "--hf-repo", dest="hf_repo", metavar="ORG/REPO[:TAG]",
                     help="a Hugging Face model, as llama.cpp's -hf")
    run.add_argument("--catalog", help="catalog model name (see `llamaplug info`)")
    run.add_argument("--raw", action="store_true", help="a completion of PROMPT as it is, no chat template")
    run.add_argument("--system", help="a system prompt (a chat)")
    run.add_argument("-n", "--n-predict", type=int, help="the most tokens to generate (default: a reply until its "
                                                          "end of turn; --raw: 64)")
    run.add_argument("-c", "--ctx-size", type=int, default=0, help="0 = the model's training context")
    run.add_argument("-t", "--threads", type=int)
    _add_sampling_arguments(run)
    run.add_argument("--stop", action="append", default=[])
    run.add_argument("--log", choices=["debug", "info", "warning", "error", "none"])
    run.add_argument("--no-timings", dest="timings", action="store_false")
    run.add_argument("--rpc", action="append", default=[], help="RPC server host:port (repeatable)")
    run.add_argument("-ngl", "--n-gpu-layers", default="auto", help='"auto" (fit to free memory), '
                     '"all" or a count (LlamaParams checks it)')
    run.add_argument("-dev", "--device", dest="devices", action="append",
                     help="offload to this device (repeatable; see `llamaplug info`); 'none' = CPU only")
    _add_draft_arguments(run)
    run.set_defaults(func=cmd_run)
    chat = sub.add_parser("chat", help="chat with a model in the terminal (history, streaming, /bye to leave)",
                          description="An interactive chat through the model's chat template: each line is a turn, "
                                      "the reply streams, the conversation is kept until /clear. Commands: /help. "
                                      "Reads stdin line by line when it is not a terminal.")
    chat.add_argument("model_arg", nargs="?", metavar="MODEL",
                      help='a GGUF file, a catalog name (`llamaplug list`) or a Hugging Face repo "org/repo[:TAG]" '
                           "(default: the first installed catalog model)")
    chat.add_argument("-m", "--model", help="the same as MODEL")
    chat.add_argument("-hf", "-hfr", "--hf-repo", dest="hf_repo", metavar="ORG/REPO[:TAG]",
                      help="a Hugging Face model, as llama.cpp's -hf")
    chat.add_argument("--catalog", help="catalog model name (see `llamaplug info`)")
    chat.add_argument("--system", help="a system prompt")
    chat.add_argument("-n", "--n-predict", type=int, default=-1, help="the most tokens a reply has (-1: until the "
                                                                        "end of the turn)")
    chat.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size (default 4096; 0 = the "
                                                                      "model's training context)")
    chat.add_argument("-t", "--threads", type=int)
    _add_sampling_arguments(chat)
    chat.add_argument("--log", choices=["debug", "info", "warning", "error", "none"])
    chat.add_argument("-ngl", "--n-gpu-layers", default="auto", help='"auto" (fit to free memory), "all" or a count')
    _add_draft_arguments(chat)
    chat.add_argument("--chat-template", metavar="JINJA_TEMPLATE",
                      help="the chat template: Jinja text, or a name of llama.cpp's built-in templates "
                           "(chatml-tools for tools on a model whose own template has none)")
    chat.add_argument("--mcp-config", "--mcp-servers-config", dest="mcp_config", metavar="FILE",
                      help="MCP servers whose tools the model may call (serve's llama-server JSON); each call is "
                           "run and shown as a line")
    chat.add_argument("--tool-choice", metavar="auto|required|none|NAME", default=None,
                      help="whether the model must call an MCP tool (NAME: that one, <server>_<tool>) in each round "
                           "(default auto)")
    chat.add_argument("--mcp-max-steps", type=_positive, default=8, metavar="N",
                      help="rounds of MCP tool calls one turn may run before its last answer (default 8)")
    chat.add_argument("--mcp-timeout", type=_seconds, default=300.0, metavar="DURATION",
                      help="the most time one turn's MCP tool calls may take (default 300s)")
    chat.set_defaults(func=cmd_chat)
    inspect = sub.add_parser("inspect", help="a GGUF file's metadata, tensors, vocabulary and chat template",
                             description="Show what a GGUF file holds, read by llamaplug's own reader "
                                         "(no model is loaded).", epilog=INSPECT_JSON,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    inspect.add_argument("model", help="GGUF file, or a catalog model's name (see `llamaplug info`)")
    inspect.add_argument("--json", action="store_true", help="one JSON document (schema below)")
    inspect.add_argument("--tensors", type=int, default=32, metavar="N", help="tensor rows to show (default 32)")
    inspect.add_argument("--all", action="store_true", help="every tensor row; every array item with --json")
    inspect.set_defaults(func=cmd_inspect)
    quant = sub.add_parser("quantize", help="quantize a GGUF model (llama-quantize's types and options)")
    quant.add_argument("src", help="GGUF model to read (F32/F16/BF16, or quantized with --allow-requantize)")
    quant.add_argument("dst", help="GGUF file to write (written only when quantizing succeeds)")
    quant.add_argument("type", help="Q4_K_M, Q8_0, IQ4_NL, ... (llamaplug.QUANT_TYPES; llama-quantize's names)")
    quant.add_argument("-t", "--threads", type=int, default=0, help="0 = every hardware thread")
    quant.add_argument("--imatrix", metavar="FILE", help="importance matrix (llama-imatrix's output)")
    quant.add_argument("--allow-requantize", action="store_true", help="accept an already quantized SRC")
    quant.add_argument("--leave-output-tensor", action="store_true", help="keep output.weight as it is")
    quant.add_argument("--pure", action="store_true", help="every tensor to TYPE: no k-quant mixture")
    quant.add_argument("-q", "--quiet", action="store_true", help="no progress bar (for scripts)")
    quant.set_defaults(func=cmd_quantize)
    rpc = sub.add_parser("rpc-server", help="serve this machine's devices to other llamaplug processes (RPC)")
    rpc.add_argument("--host", default="127.0.0.1", help="default loopback; RPC has no authentication")
    rpc.add_argument("--port", type=int, default=50052)
    rpc.add_argument("-t", "--threads", type=int, default=0)
    rpc.set_defaults(func=cmd_rpc_server)
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (pip install \"llamaplug[server]\")")
    serve.underscores_as_dashes = True
    serve.add_argument("-m", "--model", action="append", help="GGUF file, catalog name or org/repo[:TAG] (default: the "
                       "first installed catalog model); repeat it to serve several, each loaded when first asked for")
    serve.add_argument("-hf", "-hfr", "--hf-repo", dest="hf_repo", action="append", metavar="ORG/REPO[:TAG]",
                       help="a Hugging Face model (from its cache, else downloaded), as llama.cpp's -hf; one more "
                            "model as another -m")
    serve.add_argument("--catalog", help="catalog model name (see `llamaplug info`)")
    serve.add_argument("--offline", action="store_true", help="no network, as llama-server's: models come from "
                       "local files and the Hugging Face cache only (sets HF_HUB_OFFLINE)")
    serve.add_argument("-a", "--alias", action="append", help="the model id clients use for the -m before it "
                       "(default: the file name); comma-separated: its other names too, the first (sorted) the id, as "
                       "llama-server's. With one -m, every -a names it")
    serve.add_argument("--models-dir", metavar="DIR", help="serve every *.gguf in DIR, each loaded when first asked "
                       "for; DIR/models.toml may give a model's n_ctx, n_seq_max, mmproj, chat_template, aliases")
    serve.add_argument("--models-preset", metavar="FILE", help="llama-server's INI file of models (a [name] "
                       "section each, its keys the flags without dashes: hf-repo, model, c, alias, ...; [*]: every "
                       "model's), each loaded when first asked for; GET /models?reload=1 reads it again")
    serve.add_argument("--max-loaded", "--models-max", dest="max_loaded", type=_positive, metavar="N",
                       help="models loaded at once: loading one more unloads the least recently used")
    serve.add_argument("--models-autoload", dest="models_autoload", action=argparse.BooleanOptionalAction,
                       default=True, help="load a model not loaded when a request asks for it (default: on; "
                       "--no-models-autoload: such a request is a 400 until POST /models/load, as llama-server's "
                       "router)")
    serve.add_argument("--keep-alive", type=_seconds, metavar="SECONDS",
                       help='unload a model idle this long ("5m" too; a request\'s keep_alive sets its model\'s); '
                            "default: never")
    serve.add_argument("--sleep-idle", type=_seconds, metavar="SECONDS",
                       help="free a model idle this long, keeping it listed (sleeping) until its next request")
    serve.add_argument("--max-queue", type=_positive, default=512, metavar="N",
                       help="requests that may wait (for a slot or a load); more get 503 with Retry-After")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on; comma-separated for several, "
                       "a path ending in .sock for a unix socket (default: 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8080, help="port to listen on, 0 for any free one "
                       "(default: 8080)")
    serve.add_argument("-np", "--parallel", type=int, default=4, help="slots: requests decoded together "
                       "(default: 4)")
    serve.add_argument("-c", "--ctx-size", type=int, default=8192, help="KV cache positions, shared by the slots "
                       "(default: 8192)")
    serve.add_argument("-kvu", "--kv-unified", dest="kv_unified", action=argparse.BooleanOptionalAction,
                       default=False, help="one KV cache that every slot draws from, as llama-server's: a slot may "
                       "then hold up to -c positions instead of c / parallel, and when the cache is full an idle "
                       "slot's cells are taken back, or, with none left, the running requests end with a 500 "
                       "(default: off; llama-server's is on only when its -np is left to auto)")
    serve.add_argument("-no-kvu", dest="kv_unified", action="store_false", help=argparse.SUPPRESS)
    serve.add_argument("--context-shift", dest="context_shift", action=argparse.BooleanOptionalAction,
                       default=False, help="a reply that fills its slot drops half of the slot's tokens (after the "
                       "BOS) and goes on, as llama-server's (its `truncated` is then true); without -n or a "
                       "request's max_tokens it runs until the end of generation (default: off: it ends there, "
                       "finish reason length)")
    serve.add_argument("--cache-ram", type=int, default=256, metavar="MIB",
                       help="host memory for the KV of finished sequences, reused by later prompts with the same "
                            "prefix (0 = off)")
    serve.add_argument("--cache-dir", metavar="DIR",
                       help="keep the prompt cache on disk too, under --cache-ram: long prompts' KV outlives the "
                            "server (written on eviction, after a prompt of 512+ new tokens, at a clean stop); "
                            "servers may share DIR")
    serve.add_argument("--cache-disk-mib", type=int, default=4096, metavar="MIB",
                       help="the most MiB of files in --cache-dir, least recently used removed first (default 4096)")
    serve.add_argument("--cache-exact", action="store_true",
                       help="reuse a cached prefix (slot, RAM, --cache-dir) only up to a multiple of -ub, so a greedy "
                            "reply is a cold read's bit for bit (on the CPU a prompt split elsewhere rounds "
                            "otherwise); costs up to -ub - 1 more prompt tokens read per hit: pair it with a small "
                            "-ub (64 say)")
    serve.add_argument("--structured-engine", choices=["gbnf", "llguidance", "auto"], default="gbnf",
                       help="what constrains replies to a JSON schema or grammar (response_format, json_schema, "
                            "grammar; a request's structured_engine wins): gbnf (llama.cpp's, as llama-server; the "
                            "default), llguidance (plugin llamaplug-llguidance), auto (llguidance when installed)")
    serve.add_argument("-b", "--batch-size", dest="n_batch", type=int, help="tokens per decode (n_batch)")
    serve.add_argument("-ub", "--ubatch-size", dest="n_ubatch", type=_positive, metavar="N",
                       help="tokens computed at once inside a decode (n_ubatch, at most -b; default 512)")
    serve.add_argument("-t", "--threads", type=int)
    serve.add_argument("-s", "--seed", type=int, default=0xFFFFFFFF, help="seed for requests that give none")
    serve.add_argument("--mmproj", help="multimodal projector GGUF: image/audio chat parts (llamaplug-mtmd)")
    # llama-server's LoRA flags: every adapter in the order given (its id at /lora-adapters), with its scale
    serve.add_argument("--lora", dest="lora", action="append", type=_lora_files, metavar="FNAME",
                       help="a LoRA adapter GGUF at scale 1 (comma-separated: several); repeatable")
    serve.add_argument("--lora-scaled", dest="lora", action="append", type=_lora_scaled, metavar="FNAME:SCALE,...",
                       help="a LoRA adapter GGUF at SCALE (comma-separated: several); repeatable")
    serve.add_argument("--lora-init-without-apply", dest="lora_init_without_apply", action="store_true",
                       help="load the LoRA adapters at scale 0 (set scales later with POST /lora-adapters)")
    serve.add_argument("--pooling", choices=["mean", "cls", "last", "none"],
                       help="for /v1/embeddings (default: the model's own; mean where it has none); none: a vector "
                            "per token, not normalized, at /embeddings only (/v1/embeddings refuses it, as "
                            "llama-server's)")
    serve.add_argument("--api-key", type=_api_key,
                       help="require `Authorization: Bearer KEY` on every route but /health (401 otherwise); "
                            "several keys comma-separated, each reading only its own kept responses")
    serve.add_argument("--responses-db", metavar="PATH", help="the SQLite file of /v1/responses' kept responses "
                       "(store, previous_response_id) (default: $XDG_DATA_HOME/llamaplug/responses.sqlite3)")
    serve.add_argument("--responses-max-age", type=_seconds, default=720 * 3600.0, metavar="DURATION",
                       help="kept responses older than this are gone (default 720h, OpenAI's 30 days; -1: never)")
    serve.add_argument("--responses-max-mib", type=_positive, default=256, metavar="MIB",
                       help="the oldest kept responses go when their JSON passes this (default 256)")
    serve.add_argument("--no-responses-store", dest="responses_store", action="store_false",
                       help="keep no responses: previous_response_id is a 400, GET /v1/responses/{id} a 404")
    serve.add_argument("--mcp-config", "--mcp-servers-config", dest="mcp_config", metavar="FILE",
                       help='MCP servers whose tools chat requests may ask for (a tool {"type": "mcp", '
                            '"server_label": NAME}); llama-server\'s JSON: {"mcpServers": {NAME: {"command", '
                            '"args", "env", "cwd", "timeout_ms"}}}; listed at GET /tools (default: none)')
    serve.add_argument("--mcp-servers-json", dest="mcp_json", metavar="JSON",
                       help="the same config as inline JSON text, as llama-server's; with --mcp-config too, the "
                            "servers of both (a name the file has is skipped here)")
    serve.add_argument("--tools", type=_builtin_tools, default=[], metavar="TOOL1,TOOL2,...|all",
                       help="llama-server's built-in tools for its web UI at GET/POST /tools: "
                            f"{', '.join(BUILTIN_TOOLS)}; they read, write and run anything as this user for whoever "
                            "reaches the server, do not enable in untrusted environments (default: none; "
                            "--cors-origins then defaults to localhost, as llama-server's)")
    serve.add_argument("--mcp-max-steps", type=_positive, default=8, metavar="N",
                       help="rounds of MCP tool calls one request may run before its last answer (default 8)")
    serve.add_argument("--mcp-timeout", type=_seconds, default=300.0, metavar="DURATION",
                       help="the most time one request's MCP tool calls may take: a call still running then is "
                            "stopped, and one last round answers (default 300s)")
    serve.add_argument("--log", choices=["debug", "info", "warning", "error", "none"],
                       help="the library's log level (default: error; debug with --verbose). The server's own "
                            "lines (listening, one per request, stopped) show at every level but none")
    serve.add_argument("--log-format", choices=["text", "json"], default="text",
                       help="json: every log line one JSON object (time, level, logger, message, and the "
                            "request's fields on access lines)")
    serve.add_argument("-v", "--verbose", "--log-verbose", action="store_true",
                       help="llama.cpp's own log lines too (model loading, ...), at --log's level (default: debug)")
    serve.add_argument("--max-body-mib", type=_positive, default=8, metavar="MIB",
                       help="largest request body; a longer one is a 413 (default 8)")
    serve.add_argument("--max-header-kib", type=_positive, default=64, metavar="KIB",
                       help="largest request line and headers; longer is a 431 and the connection closes (default 64)")
    serve.add_argument("--max-messages", type=_positive, default=10_000, metavar="N",
                       help="most messages in one chat request (Responses: input items); more is a 400 (default "
                            "10000)")
    serve.add_argument("--max-chars", type=_positive, default=4 * 2**20, metavar="N",
                       help="most characters of text in one chat or embedding request; more is a 400 (default "
                            "4194304)")
    serve.add_argument("--max-inputs", type=_positive, default=2048, metavar="N",
                       help="most inputs in one embedding request; more is a 400 (default 2048, OpenAI's)")
    serve.add_argument("-ngl", "--n-gpu-layers", default="auto")
    serve.add_argument("--rpc", action="append", default=[], metavar="HOST:PORT",
                       help="an RPC server (`llamaplug rpc-server`) whose devices hold layers (repeatable, or "
                            "comma-separated as llama-server's)")
    _add_chat_arguments(serve)
    serve.add_argument("-fa", "--flash-attn", choices=["on", "off", "auto"], help="Flash Attention (default auto: on "
                                                                                  "where the backend has it)")
    _add_request_defaults(serve)
    _add_draft_arguments(serve)
    serve.add_argument("--ray", action="store_true", help='replicas on Ray Serve (pip install "llamaplug[ray]")')
    serve.add_argument("--ray-address", help="the Ray cluster (ray start's address; default: start a local one)")
    serve.add_argument("--replicas", type=_positive, default=1,
                       help="with --ray: engines, each -t threads (1 CPU each)")
    from ..serve_flags import add_llama_server_flags

    add_llama_server_flags(serve)  # last: llama-server's flags that are not ours become errors naming them
    serve.set_defaults(func=cmd_serve, serve_parser=serve)  # (--models-preset reads its keys with it)
    tokenizer = sub.add_parser("tokenizer", help="tokenizer tools (plugin llamaplug-tokenizer-hf)")
    groups = {"tokenizer": tokenizer.add_subparsers(dest="tokenizer_command", required=True)}
    from ..bench import add_parser
    from .cache import add_cache_commands
    from .model_commands import add_model_commands

    add_parser(sub)
    add_model_commands(sub)
    add_cache_commands(sub)
    _add_plugin_commands(sub, groups)
    return p


# Commands that plugins add, with what to install when none did: the command then says so.
MISSING_PLUGIN_COMMANDS = {
    "tokenizer export": (TokenizerError, "the tokenizer plugin: pip install llamaplug-tokenizer-hf"),
}


def _add_plugin_commands(sub: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """The commands plugins register (hook llamaplug_register_commands); a name already taken stays the first's."""
    from .. import plugins
    from ..plugin_api import Command

    def missing(name: str, error: type[LlamaError], what: str) -> Command:
        def run(args: argparse.Namespace) -> int:
            raise error(f"`llamaplug {name}` needs {what}")

        return Command(name, run, lambda p: p.add_argument("args", nargs=argparse.REMAINDER))

    found = plugins.collect_from("llamaplug_register_commands")
    found += [("core", missing(name, *hint)) for name, hint in MISSING_PLUGIN_COMMANDS.items()]
    for plugin, command in found:
        words = command.name.split() if isinstance(command, Command) else []
        if len(words) not in (1, 2):
            log.warning("plugin %s: %r is not a Command named 'word' or 'group word': left out", plugin, command)
            continue
        *group, word = words
        if group and group[0] not in groups:
            if group[0] in sub.choices:
                log.warning("plugin %s: %r is a command, not a group: %r is left out", plugin, group[0], command.name)
                continue
            groups[group[0]] = sub.add_parser(group[0]).add_subparsers(dest=f"{group[0]}_command", required=True)
        into = groups[group[0]] if group else sub
        if word in into.choices:
            if plugin != "core":
                log.warning("plugin %s: command %r is taken: left out", plugin, command.name)
            continue
        parser = into.add_parser(word, help=command.help)
        if command.arguments is not None:
            command.arguments(parser)
        parser.set_defaults(func=command.run)
