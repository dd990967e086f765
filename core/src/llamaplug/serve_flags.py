"""llama-server's command line on `llamaplug serve`: its names for what both have, and a clear no for the rest.

A script that starts llama-server should start `llamaplug serve` unchanged where it
asks for nothing we lack. `add_llama_server_flags` adds llama-server's spellings that
the serve parser does not have yet, the flags that are no-ops here (what they switch
on is always on), and, last, every other flag of llama-server's as an error naming it,
so a flag we do not implement is never silently ignored. Unknown flags stay argparse's
"unrecognized arguments".
"""

from __future__ import annotations

import argparse
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

# Flags whose feature llamaplug serve always has: accepted, doing nothing (the --help line says why).
_ALWAYS_ON = {
    ("--jinja",): "no-op: chat templates are always rendered by llama.cpp's Jinja engine",
    ("--metrics",): "no-op: /metrics is always served",
    ("--embedding", "--embeddings"): "no-op: /v1/embeddings is always served",
    ("--rerank", "--reranking"): "no-op: /v1/rerank is always served (it needs a reranker model)",
    ("--slots",): "no-op: /slots is always served",
    ("-cb", "--cont-batching"): "no-op: requests are always batched together",
    ("--cache-prompt",): "no-op: a slot's cached prefix is always reused",
    ("--no-webui", "--no-ui"): "no-op: there is no web UI",
}


# llama-server's other spellings of flags the serve parser has under another name.
_SPELLINGS = {"-a": "--alias", "-cram": "--cache-ram", "-mm": "--mmproj", "--gpu-layers": "--n-gpu-layers"}


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
    for spelling, ours in _SPELLINGS.items():
        target = serve._option_string_actions.get(ours)  # noqa: SLF001
        if target is not None and spelling not in have:
            serve.add_argument(spelling, dest=target.dest, type=target.type, help=argparse.SUPPRESS)
    for names, why in _ALWAYS_ON.items():
        names = tuple(n for n in names if n not in have)
        if names:
            serve.add_argument(*names, action="store_true", help=why, dest=f"_noop_{names[-1].lstrip('-')}")
    have = set(serve._option_string_actions)  # noqa: SLF001
    for flag in sorted(LLAMA_SERVER_FLAGS - have):
        serve.add_argument(flag, action=_Refused, dest=f"_refused_{flag.lstrip('-')}")
