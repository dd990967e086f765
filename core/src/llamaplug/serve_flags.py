"""llama-server's command line on `llamaplug serve`: its names for what both have, and a clear no for the rest.

A script that starts llama-server should start `llamaplug serve` unchanged where it
asks for nothing we lack. `add_llama_server_flags` adds llama-server's spellings that
the serve parser does not have yet, the flags that are no-ops here (what they switch
on is always on), and, last, every other flag of llama-server's as an error naming it,
so a flag we do not implement is never silently ignored. Unknown flags stay argparse's
"unrecognized arguments".

As llama-server, each flag may come from its environment variable (`LLAMA_ARG_CTX_SIZE=4096`,
`LLAMA_API_KEY`, ...: `LLAMA_ARG_ENV`), the command line winning; a boolean takes
on/enabled/true/1 or off/disabled/false/0, and `LLAMA_ARG_NO_X` turns off the flag of
`LLAMA_ARG_X`. A variable of a flag we do not implement is an error naming it, as the flag is.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

# The pin's `llama-server --help` (common/arg.cpp), every spelling. Regenerate when the pin moves.
LLAMA_SERVER_FLAGS = frozenset((
    "--adaptive-decay", "--adaptive-target", "--agent", "--alias", "--api-key", "--api-key-file",
    "--api-prefix", "--backend-sampling", "--batch-size", "--cache-idle-slots", "--cache-list", "--cache-prompt",
    "--cache-ram", "--cache-reuse", "--cache-type-k", "--cache-type-k-draft", "--cache-type-v",
    "--cache-type-v-draft", "--chat-template", "--chat-template-file", "--chat-template-kwargs", "--check-tensors",
    "--checkpoint-min-step", "--completion-bash", "--cont-batching", "--context-shift", "--control-vector",
    "--control-vector-layer-range", "--control-vector-scaled", "--cors-credentials", "--cors-headers",
    "--cors-methods", "--cors-origins", "--cpu-mask", "--cpu-mask-batch", "--cpu-mask-batch-draft",
    "--cpu-mask-draft", "--cpu-moe", "--cpu-moe-draft", "--cpu-range", "--cpu-range-batch", "--cpu-range-draft",
    "--cpu-strict", "--cpu-strict-batch", "--cpu-strict-batch-draft", "--cpu-strict-draft", "--ctx-checkpoints",
    "--ctx-size", "--defrag-thold", "--device", "--device-draft", "--docker-repo", "--draft", "--draft-max",
    "--draft-min", "--draft-n", "--draft-n-min", "--draft-p-min", "--draft-p-split", "--dry-allowed-length",
    "--dry-base", "--dry-multiplier", "--dry-penalty-last-n", "--dry-sequence-breaker", "--dynatemp-exp",
    "--dynatemp-range", "--embd-gemma-default", "--embd-normalize", "--embedding", "--embeddings", "--escape",
    "--fim-qwen-1.5b-default", "--fim-qwen-14b-spec", "--fim-qwen-30b-default", "--fim-qwen-3b-default",
    "--fim-qwen-7b-default", "--fim-qwen-7b-spec", "--fit", "--fit-ctx", "--fit-target", "--flash-attn",
    "--frequency-penalty", "--gpt-oss-120b-default", "--gpt-oss-20b-default", "--gpu-layers", "--gpu-layers-draft",
    "--grammar", "--grammar-file", "--help", "--hf-file", "--hf-repo", "--hf-repo-draft", "--hf-token", "--host",
    "--ignore-eos", "--image-max-tokens", "--image-min-tokens", "--jinja", "--json-schema", "--json-schema-file",
    "--keep", "--kv-offload", "--kv-unified", "--kv-unified-per-slot", "--lazy-mode", "--list-devices",
    "--load-mode", "--log-colors", "--log-disable", "--log-file", "--log-jsonl", "--log-prefix", "--log-prompts-dir",
    "--log-timestamps", "--log-verbose", "--log-verbosity", "--logit-bias", "--lookup-cache-dynamic",
    "--lookup-cache-static", "--lora", "--lora-init-without-apply", "--lora-scaled", "--main-gpu",
    "--mcp-servers-config", "--mcp-servers-json", "--media-path", "--metrics", "--min-p", "--mirostat",
    "--mirostat-ent", "--mirostat-lr", "--mmproj", "--mmproj-auto", "--mmproj-device", "--mmproj-offload",
    "--mmproj-url", "--model", "--model-draft", "--model-url", "--models-autoload", "--models-dir", "--models-max",
    "--models-preset", "--mtmd-batch-max-tokens", "--n-cpu-ffn", "--n-cpu-moe", "--n-cpu-moe-draft",
    "--n-gpu-layers", "--n-gpu-layers-draft", "--n-predict", "--no-agent", "--no-cache-idle-slots",
    "--no-cache-prompt", "--no-cont-batching", "--no-context-shift", "--no-cors-credentials", "--no-escape",
    "--no-host", "--no-jinja", "--no-kv-offload", "--no-kv-unified", "--no-log-jsonl", "--no-log-prefix",
    "--no-log-timestamps", "--no-mmproj", "--no-mmproj-auto", "--no-mmproj-offload", "--no-models-autoload",
    "--no-op-offload", "--no-perf", "--no-prefill-assistant", "--no-reasoning-preserve", "--no-repack",
    "--no-skip-chat-parsing", "--no-slots", "--no-spec-draft-backend-sampling", "--no-ui", "--no-ui-mcp-proxy",
    "--no-warmup", "--no-webui", "--no-webui-mcp-proxy", "--numa", "--offline", "--op-offload", "--override-kv",
    "--override-tensor", "--override-tensor-draft", "--parallel", "--path", "--perf", "--poll", "--poll-batch",
    "--poll-batch-draft", "--poll-draft", "--pooling", "--port", "--predict", "--prefill-assistant",
    "--presence-penalty", "--prio", "--prio-batch", "--prio-batch-draft", "--prio-draft", "--props", "--reasoning",
    "--reasoning-budget", "--reasoning-budget-message", "--reasoning-effort", "--reasoning-format",
    "--reasoning-preserve", "--repack", "--repeat-last-n", "--repeat-penalty", "--rerank", "--reranking",
    "--reuse-port", "--reverse-prompt", "--rope-freq-base", "--rope-freq-scale", "--rope-scale", "--rope-scaling",
    "--rpc", "--sampler-seq", "--samplers", "--sampling-seq", "--seed", "--skip-chat-parsing",
    "--sleep-idle-seconds", "--slot-prompt-similarity", "--slot-save-path", "--slots", "--spec-default",
    "--spec-draft-backend-sampling", "--spec-draft-cpu-mask", "--spec-draft-cpu-mask-batch", "--spec-draft-cpu-moe",
    "--spec-draft-cpu-range", "--spec-draft-cpu-strict", "--spec-draft-cpu-strict-batch", "--spec-draft-device",
    "--spec-draft-hf", "--spec-draft-model", "--spec-draft-n-cpu-moe", "--spec-draft-n-max", "--spec-draft-n-min",
    "--spec-draft-ncmoe", "--spec-draft-ngl", "--spec-draft-override-tensor", "--spec-draft-p-min",
    "--spec-draft-p-split", "--spec-draft-poll", "--spec-draft-poll-batch", "--spec-draft-prio",
    "--spec-draft-prio-batch", "--spec-draft-threads", "--spec-draft-threads-batch", "--spec-draft-type-k",
    "--spec-draft-type-v", "--spec-ngram-map-k-min-hits", "--spec-ngram-map-k-size-m", "--spec-ngram-map-k-size-n",
    "--spec-ngram-map-k4v-min-hits", "--spec-ngram-map-k4v-size-m", "--spec-ngram-map-k4v-size-n",
    "--spec-ngram-min-hits", "--spec-ngram-mod-n-match", "--spec-ngram-mod-n-max", "--spec-ngram-mod-n-min",
    "--spec-ngram-simple-min-hits", "--spec-ngram-simple-size-m", "--spec-ngram-simple-size-n",
    "--spec-ngram-size-m", "--spec-ngram-size-n", "--spec-synth-len", "--spec-synth-rates", "--spec-type",
    "--special", "--split-mode", "--spm-infill", "--sse-ping-interval", "--ssl-cert-file", "--ssl-key-file",
    "--swa-checkpoints", "--swa-full", "--tags", "--temp", "--temperature", "--tensor-split", "--threads",
    "--threads-batch", "--threads-batch-draft", "--threads-draft", "--threads-http", "--timeout", "--tools",
    "--tools-runtime", "--top-k", "--top-n-sigma", "--top-nsigma", "--top-p", "--typical", "--typical-p",
    "--ubatch-size", "--ui", "--ui-config", "--ui-config-file", "--ui-mcp-proxy", "--usage", "--verbose",
    "--verbosity", "--version", "--video-ffmpeg-dir", "--video-fps", "--video-timestamp-interval",
    "--vision-gemma-12b-default", "--vision-gemma-4b-default", "--warmup", "--webui", "--webui-config",
    "--webui-config-file", "--webui-mcp-proxy", "--xtc-probability", "--xtc-threshold", "--yarn-attn-factor",
    "--yarn-beta-fast", "--yarn-beta-slow", "--yarn-ext-factor", "--yarn-orig-ctx", "-C", "-Cb", "-Cbd", "-Cd",
    "-Cr", "-Crb", "-Crd", "-a", "-ag", "-b", "-bs", "-c", "-cb", "-cl", "-cmoe", "-cmoed", "-cms", "-cram", "-ctk",
    "-ctkd", "-ctv", "-ctvd", "-ctxcp", "-dev", "-devd", "-dr", "-dt", "-e", "-fa", "-fit", "-fitc", "-fitt", "-h",
    "-hf", "-hfd", "-hff", "-hfr", "-hfrd", "-hft", "-j", "-jf", "-kvo", "-kvu", "-l", "-lcd", "-lcs", "-lm", "-lv",
    "-lzm", "-m", "-md", "-mg", "-mm", "-mmdev", "-mmu", "-mu", "-n", "-ncffn", "-ncmoe", "-ncmoed", "-ngl", "-ngld",
    "-nkvo", "-no-ag", "-no-kvu", "-nocb", "-np", "-nr", "-ot", "-otd", "-r", "-rea", "-s", "-sm", "-sp", "-sps",
    "-t", "-tb", "-tbd", "-td", "-to", "-ts", "-ub", "-v",
))

# The pin's environment variable of each llama-server flag (common/arg.cpp's set_env), by its first long spelling.
# Regenerate when the pin moves (test_server_contract checks it against the pin's source).
LLAMA_ARG_ENV = {
    "HF_TOKEN": "--hf-token", "LLAMA_API_KEY": "--api-key", "LLAMA_ARG_AGENT": "--agent",
    "LLAMA_ARG_ALIAS": "--alias", "LLAMA_ARG_API_KEY_FILE": "--api-key-file", "LLAMA_ARG_API_PREFIX": "--api-prefix",
    "LLAMA_ARG_BACKEND_SAMPLING": "--backend-sampling", "LLAMA_ARG_BATCH": "--batch-size",
    "LLAMA_ARG_CACHE_IDLE_SLOTS": "--cache-idle-slots", "LLAMA_ARG_CACHE_PROMPT": "--cache-prompt",
    "LLAMA_ARG_CACHE_RAM": "--cache-ram", "LLAMA_ARG_CACHE_REUSE": "--cache-reuse",
    "LLAMA_ARG_CACHE_TYPE_K": "--cache-type-k", "LLAMA_ARG_CACHE_TYPE_V": "--cache-type-v",
    "LLAMA_ARG_CHAT_TEMPLATE": "--chat-template", "LLAMA_ARG_CHAT_TEMPLATE_FILE": "--chat-template-file",
    "LLAMA_ARG_CHAT_TEMPLATE_KWARGS": "--chat-template-kwargs",
    "LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT": "--checkpoint-min-step", "LLAMA_ARG_CONTEXT_SHIFT": "--context-shift",
    "LLAMA_ARG_CONT_BATCHING": "--cont-batching", "LLAMA_ARG_CORS_CREDENTIALS": "--cors-credentials",
    "LLAMA_ARG_CORS_HEADERS": "--cors-headers", "LLAMA_ARG_CORS_METHODS": "--cors-methods",
    "LLAMA_ARG_CORS_ORIGINS": "--cors-origins", "LLAMA_ARG_CPU_MOE": "--cpu-moe",
    "LLAMA_ARG_CTX_CHECKPOINTS": "--ctx-checkpoints", "LLAMA_ARG_CTX_SIZE": "--ctx-size",
    "LLAMA_ARG_DEFRAG_THOLD": "--defrag-thold", "LLAMA_ARG_DEVICE": "--device",
    "LLAMA_ARG_DOCKER_REPO": "--docker-repo", "LLAMA_ARG_DRAFT_MAX": "--draft", "LLAMA_ARG_DRAFT_MIN": "--draft-min",
    "LLAMA_ARG_EMBEDDINGS": "--embedding", "LLAMA_ARG_ENDPOINT_METRICS": "--metrics",
    "LLAMA_ARG_ENDPOINT_PROPS": "--props", "LLAMA_ARG_ENDPOINT_SLOTS": "--slots", "LLAMA_ARG_FIT": "--fit",
    "LLAMA_ARG_FIT_CTX": "--fit-ctx", "LLAMA_ARG_FIT_TARGET": "--fit-target", "LLAMA_ARG_FLASH_ATTN": "--flash-attn",
    "LLAMA_ARG_FREQUENCY_PENALTY": "--frequency-penalty", "LLAMA_ARG_HF_FILE": "--hf-file",
    "LLAMA_ARG_HF_REPO": "--hf-repo", "LLAMA_ARG_HOST": "--host", "LLAMA_ARG_IMAGE_MAX_TOKENS": "--image-max-tokens",
    "LLAMA_ARG_IMAGE_MIN_TOKENS": "--image-min-tokens", "LLAMA_ARG_JINJA": "--jinja",
    "LLAMA_ARG_KV_OFFLOAD": "--kv-offload", "LLAMA_ARG_KV_UNIFIED": "--kv-unified",
    "LLAMA_ARG_KV_UNIFIED_PER_SLOT": "--kv-unified-per-slot", "LLAMA_ARG_LAZY_MODE": "--lazy-mode",
    "LLAMA_ARG_LOAD_MODE": "--load-mode", "LLAMA_ARG_LOG_COLORS": "--log-colors", "LLAMA_ARG_LOG_FILE": "--log-file",
    "LLAMA_ARG_LOG_JSONL": "--log-jsonl", "LLAMA_ARG_LOG_PREFIX": "--log-prefix",
    "LLAMA_ARG_LOG_TIMESTAMPS": "--log-timestamps", "LLAMA_ARG_LOG_VERBOSITY": "--verbosity",
    "LLAMA_ARG_MAIN_GPU": "--main-gpu", "LLAMA_ARG_MCP_SERVERS_CONFIG": "--mcp-servers-config",
    "LLAMA_ARG_MCP_SERVERS_JSON": "--mcp-servers-json", "LLAMA_ARG_MIN_P": "--min-p", "LLAMA_ARG_MMPROJ": "--mmproj",
    "LLAMA_ARG_MMPROJ_AUTO": "--mmproj-auto", "LLAMA_ARG_MMPROJ_OFFLOAD": "--mmproj-offload",
    "LLAMA_ARG_MMPROJ_URL": "--mmproj-url", "LLAMA_ARG_MODEL": "--model",
    "LLAMA_ARG_MODELS_AUTOLOAD": "--models-autoload", "LLAMA_ARG_MODELS_DIR": "--models-dir",
    "LLAMA_ARG_MODELS_MAX": "--models-max", "LLAMA_ARG_MODELS_PRESET": "--models-preset",
    "LLAMA_ARG_MODEL_URL": "--model-url", "LLAMA_ARG_MTMD_BATCH_MAX_TOKENS": "--mtmd-batch-max-tokens",
    "LLAMA_ARG_NO_HOST": "--no-host", "LLAMA_ARG_NUMA": "--numa", "LLAMA_ARG_N_CPU_FFN": "--n-cpu-ffn",
    "LLAMA_ARG_N_CPU_MOE": "--n-cpu-moe", "LLAMA_ARG_N_GPU_LAYERS": "--gpu-layers",
    "LLAMA_ARG_N_GPU_LAYERS_DRAFT": "--spec-draft-ngl", "LLAMA_ARG_N_PARALLEL": "--parallel",
    "LLAMA_ARG_N_PREDICT": "--predict", "LLAMA_ARG_OFFLINE": "--offline",
    "LLAMA_ARG_OVERRIDE_TENSOR": "--override-tensor", "LLAMA_ARG_PERF": "--perf", "LLAMA_ARG_POOLING": "--pooling",
    "LLAMA_ARG_PORT": "--port", "LLAMA_ARG_PREFILL_ASSISTANT": "--prefill-assistant",
    "LLAMA_ARG_PRESENCE_PENALTY": "--presence-penalty", "LLAMA_ARG_REASONING": "--reasoning",
    "LLAMA_ARG_REASONING_EFFORT": "--reasoning-effort", "LLAMA_ARG_REASONING_PRESERVE": "--reasoning-preserve",
    "LLAMA_ARG_REPACK": "--repack", "LLAMA_ARG_REPEAT_PENALTY": "--repeat-penalty",
    "LLAMA_ARG_RERANKING": "--rerank", "LLAMA_ARG_REUSE_PORT": "--reuse-port",
    "LLAMA_ARG_ROPE_FREQ_BASE": "--rope-freq-base", "LLAMA_ARG_ROPE_FREQ_SCALE": "--rope-freq-scale",
    "LLAMA_ARG_ROPE_SCALE": "--rope-scale", "LLAMA_ARG_ROPE_SCALING_TYPE": "--rope-scaling",
    "LLAMA_ARG_RPC": "--rpc", "LLAMA_ARG_SKIP_CHAT_PARSING": "--skip-chat-parsing",
    "LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING": "--spec-draft-backend-sampling",
    "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K": "--spec-draft-type-k",
    "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V": "--spec-draft-type-v",
    "LLAMA_ARG_SPEC_DRAFT_CPU_MOE": "--spec-draft-cpu-moe", "LLAMA_ARG_SPEC_DRAFT_HF_REPO": "--spec-draft-hf",
    "LLAMA_ARG_SPEC_DRAFT_MODEL": "--spec-draft-model", "LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE": "--spec-draft-n-cpu-moe",
    "LLAMA_ARG_SPEC_DRAFT_N_MAX": "--spec-draft-n-max", "LLAMA_ARG_SPEC_DRAFT_N_MIN": "--spec-draft-n-min",
    "LLAMA_ARG_SPEC_DRAFT_P_MIN": "--spec-draft-p-min", "LLAMA_ARG_SPEC_DRAFT_P_SPLIT": "--spec-draft-p-split",
    "LLAMA_ARG_SPEC_SYNTH_LEN": "--spec-synth-len", "LLAMA_ARG_SPEC_SYNTH_RATES": "--spec-synth-rates",
    "LLAMA_ARG_SPEC_TYPE": "--spec-type", "LLAMA_ARG_SPLIT_MODE": "--split-mode",
    "LLAMA_ARG_SSE_PING_INTERVAL": "--sse-ping-interval", "LLAMA_ARG_SSL_CERT_FILE": "--ssl-cert-file",
    "LLAMA_ARG_SSL_KEY_FILE": "--ssl-key-file", "LLAMA_ARG_STATIC_PATH": "--path",
    "LLAMA_ARG_SWA_FULL": "--swa-full", "LLAMA_ARG_TAGS": "--tags", "LLAMA_ARG_TEMPERATURE": "--temp",
    "LLAMA_ARG_TENSOR_SPLIT": "--tensor-split", "LLAMA_ARG_THINK": "--reasoning-format",
    "LLAMA_ARG_THINK_BUDGET": "--reasoning-budget", "LLAMA_ARG_THINK_BUDGET_MESSAGE": "--reasoning-budget-message",
    "LLAMA_ARG_THREADS": "--threads", "LLAMA_ARG_THREADS_HTTP": "--threads-http", "LLAMA_ARG_TIMEOUT": "--timeout",
    "LLAMA_ARG_TOOLS": "--tools", "LLAMA_ARG_TOOLS_RUNTIME": "--tools-runtime", "LLAMA_ARG_TOP_K": "--top-k",
    "LLAMA_ARG_TOP_P": "--top-p", "LLAMA_ARG_UBATCH": "--ubatch-size", "LLAMA_ARG_UI": "--ui",
    "LLAMA_ARG_UI_CONFIG": "--ui-config", "LLAMA_ARG_UI_CONFIG_FILE": "--ui-config-file",
    "LLAMA_ARG_UI_MCP_PROXY": "--ui-mcp-proxy", "LLAMA_ARG_VIDEO_FFMPEG_DIR": "--video-ffmpeg-dir",
    "LLAMA_ARG_VIDEO_FPS": "--video-fps", "LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL": "--video-timestamp-interval",
    "LLAMA_ARG_YARN_ATTN_FACTOR": "--yarn-attn-factor", "LLAMA_ARG_YARN_BETA_FAST": "--yarn-beta-fast",
    "LLAMA_ARG_YARN_BETA_SLOW": "--yarn-beta-slow", "LLAMA_ARG_YARN_EXT_FACTOR": "--yarn-ext-factor",
    "LLAMA_ARG_YARN_ORIG_CTX": "--yarn-orig-ctx",
}

# Set in most Hugging Face setups for other tools: not taken as a request for llama-server's --hf-token.
_ENV_NOT_OURS = frozenset({"HF_TOKEN"})


# Flags whose setting llamaplug serve always has: accepted, doing nothing (the --help line says why).
_ALWAYS_ON = {
    ("--embedding", "--embeddings"): "no-op: /v1/embeddings is always served",
    ("--rerank", "--reranking"): "no-op: /v1/rerank is always served (it needs a reranker model)",
    ("-cb", "--cont-batching"): "no-op: requests are always batched together",
    ("--cache-prompt",): "no-op: a slot's cached prefix is always reused",
    # (llama-server's default, --cache-idle-slots, saves every idle slot at each new request: refused here)
    ("--no-cache-idle-slots",): "no-op: an idle slot's KV goes to the host prompt cache only when a request takes "
                                "its slot or (--kv-unified) its cells, as llama-server's --no-cache-idle-slots",
}


# llama-server's other spellings of flags the serve parser has under another name.
_SPELLINGS = {"-cram": "--cache-ram", "-mm": "--mmproj", "--gpu-layers": "--n-gpu-layers",
              "--sleep-idle-seconds": "--sleep-idle"}


class _Refused(argparse.Action):
    """A llama-server flag we do not implement: using it is an error that names it."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any):
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string} is a llama-server flag that `llamaplug serve` does not implement "
                     "(see `llamaplug serve --help` for the ones it does)")


def add_llama_server_flags(serve: argparse.ArgumentParser) -> None:
    """llama-server's flags on `serve`: call it after every flag of our own is added (the rest become errors)."""
    have = set(serve._option_string_actions)  # noqa: SLF001 - argparse keeps no public list of option strings
    if "-n" not in have and "--n-predict" not in have:
        serve.add_argument("-n", "--n-predict", type=int, default=-1, metavar="N",
                           help="tokens to generate when a request gives no limit (n_predict, max_tokens, ...) "
                                "(-1: until the end or a full context)")
    if "--slot-save-path" not in have:
        serve.add_argument("--slot-save-path", metavar="DIR",
                           help="folder for POST /slots/ID?action=save|restore (without it those are refused)")
    if "--media-path" not in have:
        serve.add_argument("--media-path", metavar="DIR", type=_folder,
                           help="folder media file:// URLs are read from, by paths relative to it (no '..', "
                                "nothing that resolves outside it); without it file:// URLs are refused, as "
                                "llama-server's (default: disabled)")
    for spelling, ours in _SPELLINGS.items():
        target = serve._option_string_actions.get(ours)  # noqa: SLF001
        if target is not None and spelling not in have:  # the same action (-a, a plain store, once split "foo")
            serve.add_argument(spelling, dest=target.dest, type=target.type, action=type(target),
                               help=argparse.SUPPRESS)
    for names, why in _ALWAYS_ON.items():
        names = tuple(n for n in names if n not in have)
        if names:
            serve.add_argument(*names, action="store_true", help=why, dest=f"_noop_{names[-1].lstrip('-')}")
    _add_http_flags(serve, have)
    if "--webui" not in have:
        serve.add_argument("--webui", "--ui", dest="webui", action=argparse.BooleanOptionalAction, default=True,
                           help="the chat page at / (default: on; --no-webui: / and the page's files answer 404, "
                                "as llama-server's)")
    if "--metrics" not in have:
        serve.add_argument("--metrics", dest="endpoint_metrics", action="store_true",
                           help="serve GET /metrics, Prometheus text (default: off, a 501, as llama-server's)")
    if "--ui-mcp-proxy" not in have:
        serve.add_argument("--ui-mcp-proxy", "--webui-mcp-proxy", dest="ui_mcp_proxy",
                           action=argparse.BooleanOptionalAction, default=False,
                           help="GET/POST /cors-proxy?url=URL, llama-server's MCP CORS proxy for browser pages: "
                                "any server can reach any URL through it, do not enable in untrusted "
                                "environments (default: off, 403)")
    if "--shutdown-timeout" not in have:
        serve.add_argument("--shutdown-timeout", type=_seconds, default=5.0, metavar="SECONDS",
                           help="on SIGTERM or Ctrl-C, how long running requests may go on before their streams "
                                "end with an error event (default 5; a second signal ends them at once)")
    have = set(serve._option_string_actions)  # noqa: SLF001
    for flag in sorted(LLAMA_SERVER_FLAGS - have):
        serve.add_argument(flag, action=_Refused, dest=f"_refused_{flag.lstrip('-')}")
    from_environment(serve, os.environ)


def _add_http_flags(serve: argparse.ArgumentParser, have: set[str]) -> None:
    """llama-server's CORS, /slots and --tags flags, with its defaults."""
    from .server.cors import DEFAULT_METHODS

    if "--cors-origins" in have:
        return
    serve.add_argument("--cors-origins", metavar="ORIGINS",
                       help='origins a browser page may call from: "*", "localhost" (loopback pages only) or a '
                            'comma-separated list (default: "*" with --api-key, as llama-server; without one, '
                            "loopback pages only, and other origins' requests refused: docs/serving.md)")
    serve.add_argument("--cors-methods", default=DEFAULT_METHODS, metavar="METHODS",
                       help=f"methods a preflight allows (default: {DEFAULT_METHODS})")
    serve.add_argument("--cors-headers", default="*", metavar="HEADERS", help="headers a preflight allows "
                       "(default: *)")
    serve.add_argument("--cors-credentials", action=argparse.BooleanOptionalAction, default=True,
                       help="allow credentials; with --cors-origins * the request's Origin is echoed (default: on)")
    serve.add_argument("--slots", dest="endpoint_slots", action=argparse.BooleanOptionalAction, default=True,
                       help="serve GET/POST /slots (--no-slots: 501, as llama-server)")
    serve.add_argument("--tags", metavar="TAGS", help="the model's tags, comma-separated (shown in /v1/models)")


def _folder(text: str) -> str:
    if not os.path.isdir(text):  # (llama-server's words)
        raise argparse.ArgumentTypeError(f"not a directory: {text}")
    return text


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:  # (NaN too)
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds >= 0")
    return value


class _FromEnvironment(list):  # type: ignore[type-arg]
    """The default of a repeatable flag taken from its variable: the command line's own values replace it."""


_TRUE, _FALSE = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0")


def from_environment(serve: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Take `environ`'s LLAMA_ARG_* variables as defaults of `serve`'s flags, as llama-server does.

    What cannot be taken (a variable of a flag we refuse, a value that is not the flag's type) is kept in
    the defaults as `_environment_errors`, for `environment_errors` to raise when serving (building the
    parser must not fail: `llamaplug info` builds it too).
    """
    actions = serve._option_string_actions  # noqa: SLF001
    errors: list[str] = []
    for name, flag in LLAMA_ARG_ENV.items():
        negative = name.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1) if name.startswith("LLAMA_ARG_") else None
        value = "0" if negative is not None and negative in environ else environ.get(name)
        action = actions.get(flag)
        if value is None or action is None or name in _ENV_NOT_OURS:
            continue
        if isinstance(action, _Refused):
            errors.append(f"{name} sets {flag}, a llama-server flag that `llamaplug serve` does not implement")
            continue
        try:
            serve.set_defaults(**{action.dest: _value(action, value)})
        except (ValueError, argparse.ArgumentTypeError) as exc:
            errors.append(f"{name}={value!r} is not a value for {flag}: {exc}")
    serve.set_defaults(_environment_errors=errors)


def _value(action: argparse.Action, text: str) -> Any:
    if action.nargs == 0:  # a switch (store_true, --x/--no-x)
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise ValueError(f"a boolean is one of {', '.join(_TRUE + _FALSE)}")
    value = action.type(text) if callable(action.type) else text
    if isinstance(action, argparse._AppendAction):  # noqa: SLF001 - argparse has no public name for it
        return _FromEnvironment([value])
    return value


def settle(args: argparse.Namespace) -> argparse.Namespace:
    """After parsing: a repeatable flag given on the command line drops its variable's value (as llama-server,
    the command line wins), and a variable that could not be taken is an error naming it."""
    from .errors import InvalidParameterError

    errors = getattr(args, "_environment_errors", [])
    if errors:
        raise InvalidParameterError("; ".join(errors), field="environment")
    for key, value in vars(args).items():
        if isinstance(value, _FromEnvironment):
            setattr(args, key, list(value[1:]) if len(value) > 1 else list(value))
    return args
