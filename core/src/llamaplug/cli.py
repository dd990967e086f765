"""The `llamaplug` command: `info`, `run`, `serve`, ...; plugins add theirs (hook llamaplug_register_commands)."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__
from .errors import LlamaError, TokenizerError

if TYPE_CHECKING:
    from .blocks.gguf_info import GgufInfo
    from .params import LlamaParams

log = logging.getLogger("llamaplug.cli")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def cmd_info(args: argparse.Namespace) -> int:
    from . import GGML_VERSION, LLAMA_CPP_COMMIT, catalog, plugins
    from .blocks.backend import LlamaBackend

    print(f"llamaplug {__version__}")
    print(f"llama.cpp {LLAMA_CPP_COMMIT} (ggml {GGML_VERSION})")
    backend = LlamaBackend.init()  # first: a plugin whose registration hook fails is known only after it
    print("plugins:")
    broken = plugins.broken_plugins()
    for name, plugin in sorted(plugins.pm.list_name_plugin()):
        if name.startswith("llamaplug.") or name == "catalog" or plugin is None or name in broken:
            continue
        print(f"  {name}")
    for name, error in sorted(broken.items()):
        print(f"  {name}: broken: {error}")
    factories = plugins.sampler_factories()
    print("samplers (SamplerChain().add(name, **options)):" + ("" if factories else " (none installed)"))
    for name, found in sorted(factories.items()):
        print(f"  {name:16} [{found.distribution or found.plugin}]")
    print("backends:")
    for status in backend.backends():
        state = "loaded" if status.loaded else ("available" if status.ok else "cannot run")
        reason = status.reason or (_RPC_NOTE if status.name == "rpc" and status.loaded else "")
        print(f"  {status.name:8} {state:10} {reason}  [{status.distribution}]")
    print("devices:")
    devices = backend.devices()
    for dev in devices:
        print(f"  {dev.name:8} {dev.type:5} {dev.description}  free {_gib(dev.memory_free)} / {_gib(dev.memory_total)}")
    print(f"gpu offload: {_offload_words(backend.supports_gpu_offload(), devices)}  mmap: {backend.supports_mmap()}  "
          f"mlock: {backend.supports_mlock()}  rpc: {backend.supports_rpc()}")
    print(f"system: {backend.system_info()}")
    print("models:")
    for entry in catalog.entries():
        path = entry.locate()
        print(f"  {entry.name:24} {path if path else 'not installed: ' + entry.install}")
    if args.mmproj:
        print("multimodal:")
        try:
            found = plugins.first_answer("llamaplug_describe_projector", path=Path(args.mmproj))
        except LlamaError as exc:
            print(f"  mmproj {args.mmproj}: {exc}")
            return 1
        if found is None:
            print(f"  mmproj {args.mmproj}: cannot read it: pip install llamaplug-mtmd")
            return 1
        plugin, line = found
        print(f"  mmproj {args.mmproj}: {line}  [{plugins.distribution_of(plugin) or plugin}]")
    return 0


_RPC_NOTE = "(devices of other machines' `llamaplug rpc-server`, used with --rpc HOST:PORT; none until then)"


def _offload_words(supported: bool, devices: list) -> str:
    """llama.cpp's "supports GPU offload" is true with the RPC backend alone: say what it means here."""
    if not supported:
        return "no (no GPU backend loaded: every layer runs on the CPU)"
    gpus = [d.name for d in devices if d.type != "cpu"]
    if gpus:
        return f"yes, to {', '.join(gpus)}"
    return "no GPU here (llama.cpp says yes because the rpc backend can reach remote devices with --rpc)"


def model_path(model: str) -> str | Path:
    """A GGUF path, or "org/repo[:TAG]" (not an existing path): that Hub model, downloaded (or cached)."""
    from .high import hub

    ref = hub.parse_ref(model)
    if ref is None or model.lower().endswith(".gguf") or Path(model).exists():
        return model
    return hub.download(ref[0], tag=ref[1])


def cmd_run(args: argparse.Namespace) -> int:
    from .blocks.sampling import SamplerChain
    from .catalog import default_model
    from .errors import InvalidParameterError
    from .high.llama import Llama
    from .params import LlamaParams, SamplerParams

    if len(args.prompt) > 2 or (len(args.prompt) == 2 and args.model):
        raise InvalidParameterError("`llamaplug run` takes [MODEL] PROMPT (or -m MODEL PROMPT); quote the prompt",
                                    field="prompt")
    model = args.prompt[0] if len(args.prompt) == 2 else args.model
    args.prompt = args.prompt[-1]
    path = model_path(model) if model else default_model(args.catalog)
    extra: dict[str, object] = {"n_threads": args.threads} if args.threads else {}
    if args.devices:
        extra["devices"] = [] if args.devices == ["none"] else args.devices
    llama = Llama.load(LlamaParams(model_path=path, n_ctx=args.ctx_size, log_level=args.log, rpc_servers=args.rpc,
                                   n_gpu_layers=args.n_gpu_layers, **extra, **_draft_params(args)))
    sampling = SamplerParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                             penalty_repeat=args.repeat_penalty, seed=args.seed)
    sys.stdout.write(args.prompt)
    final = None
    # closed on the way out, Ctrl-C too: the engine's thread stops before the interpreter does
    with llama, SamplerChain.from_params(sampling) as sampler:
        for chunk in llama.create_completion(args.prompt, max_tokens=args.n_predict, sampler=sampler,
                                             stop=args.stop, stream=True):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            final = chunk
    sys.stdout.write("\n")
    if final is not None and final.timings is not None and args.timings:
        t = final.timings
        print(f"[{final.stop_reason.value}] prompt {t.prompt_tokens} tokens {t.prompt_per_second:.1f} t/s, "
              f"generated {t.predicted_tokens} tokens {t.predicted_per_second:.1f} t/s"
              + (f", drafted {t.drafted_tokens} accepted {t.accepted_tokens}" if t.drafted_tokens else ""),
              file=sys.stderr)
    return 0


def _add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    """llama-server's chat-layer flags, with its meanings (`llama-server --help` of the pin)."""
    parser.add_argument("--chat-template", metavar="JINJA_TEMPLATE",
                        help="the chat template of the -m models: Jinja text, or a name of llama.cpp's built-in "
                             "templates (default: the GGUF's own)")
    parser.add_argument("--chat-template-file", metavar="FILE", help="the chat template, read from FILE")
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


def chat_settings(args: argparse.Namespace) -> tuple[str | None, object]:
    """The chat template (--chat-template or --chat-template-file) and the server's ChatSettings."""
    from .errors import InvalidParameterError
    from .high.chat import ChatSettings

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


def cmd_chat(args: argparse.Namespace) -> int:
    from .catalog import default_model
    from .chat_repl import repl
    from .high.llama import Llama

    path = model_path(args.model_arg or args.model) if (args.model_arg or args.model) else default_model(args.catalog)
    extra: dict[str, object] = {"n_threads": args.threads} if args.threads else {}
    with Llama.load(path, n_ctx=args.ctx_size, log_level=args.log, n_gpu_layers=args.n_gpu_layers, **extra) as llama:
        sampling = {"temperature": args.temp, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
                    "repeat_penalty": args.repeat_penalty, "seed": args.seed}
        return repl(llama, sampling, None if args.n_predict < 0 else args.n_predict, args.system)


def _add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """llama.cpp's sampling flags and defaults (SamplerParams'), for `run` and `chat`."""
    parser.add_argument("--temp", type=float, default=0.8, help="temperature (default 0.8; 0 = greedy)")
    parser.add_argument("--top-k", type=int, default=40, help="default 40; 0 = off")
    parser.add_argument("--top-p", type=float, default=0.95, help="default 0.95; 1.0 = off")
    parser.add_argument("--min-p", type=float, default=0.05, help="default 0.05; 0.0 = off")
    parser.add_argument("--repeat-penalty", type=float, default=1.0, help="default 1.0 = off")
    parser.add_argument("-s", "--seed", type=int, default=0xFFFFFFFF, help="default: random")


# llama-server's flags for the sampling of requests that do not set it: (flags, SamplerParams field, type).
_REQUEST_DEFAULTS = [
    (("--temp", "--temperature"), "temperature", float), (("--top-k",), "top_k", int), (("--top-p",), "top_p", float),
    (("--min-p",), "min_p", float), (("--typical", "--typical-p"), "typical_p", float),
    (("--repeat-penalty",), "penalty_repeat", float), (("--repeat-last-n",), "penalty_last_n", int),
    (("--presence-penalty",), "penalty_present", float), (("--frequency-penalty",), "penalty_freq", float),
]


def _add_request_defaults(serve: argparse.ArgumentParser) -> None:
    for flags, field, kind in _REQUEST_DEFAULTS:
        serve.add_argument(*flags, dest=f"default_{field}", type=kind, metavar="X",
                           help=f"{field} of requests that do not give one (llama-server's default otherwise)")


def _request_defaults(args: argparse.Namespace) -> dict[str, object]:
    """The SamplerParams fields that --temp, --top-k, ... set (checked here: a bad one fails at startup)."""
    from .params import SamplerParams

    given = {field: getattr(args, f"default_{field}") for _, field, _ in _REQUEST_DEFAULTS
             if getattr(args, f"default_{field}") is not None}
    SamplerParams(**given)
    return given


def _add_draft_arguments(parser: argparse.ArgumentParser) -> None:
    """Speculative decoding (LlamaParams.draft_*), for `run` and `serve`."""
    parser.add_argument("-md", "--draft-model", help="a small GGUF of the same vocabulary that drafts tokens")
    parser.add_argument("--spec", choices=["ngram"], help="draft without a model: n-gram lookup in the sequence")
    parser.add_argument("--draft-max", type=int, default=16, help="the most tokens drafted per step (default 16)")
    parser.add_argument("--draft-min", type=int, default=0, help="drop a draft model's shorter drafts (default 0)")
    parser.add_argument("--draft-p-min", type=float, default=0.0, help="stop drafting below this probability")


def _draft_params(args: argparse.Namespace) -> dict[str, object]:
    return {"draft_model_path": args.draft_model, "speculative": args.spec, "draft_max": args.draft_max,
            "draft_min": args.draft_min, "draft_p_min": args.draft_p_min}


def cmd_serve(args: argparse.Namespace) -> int:
    from .catalog import default_model
    from .errors import InvalidParameterError

    if not args.models_dir and not args.ray:  # the -m models load with the default backends
        from .blocks.backend import probe_ahead

        probe_ahead()  # the backends' probes run while the web stack imports: /health is ready sooner
    try:
        import importlib.util

        if importlib.util.find_spec("uvicorn") is None:
            raise ImportError(name="uvicorn")
        from .server.model_specs import spec_for_file, specs_from_dir
    except ImportError as exc:
        raise InvalidParameterError(f'`llamaplug serve` needs the server extra: pip install "llamaplug[server]" '
                                    f"({exc.name} is missing)") from None
    from .serve_flags import settle

    settle(args)  # LLAMA_ARG_* variables the command line did not override
    from . import serve_log

    native_log = serve_log.configure(args.log, args.log_format, args.verbose)
    if args.api_key is None and any(h.strip() not in ("127.0.0.1", "localhost", "::1") and not h.endswith(".sock")
                                    for h in args.host.split(",")):
        serve_log.log.warning("serving on %s, not loopback, without --api-key: anyone who reaches it can use it",
                              args.host)
    # As llama-server: -c is the whole KV cache, each slot holds c / parallel positions.
    base: dict[str, object] = {"n_ctx": args.ctx_size, "n_seq_max": args.parallel, "cache_ram_mib": args.cache_ram,
                               "log_level": native_log, "n_gpu_layers": args.n_gpu_layers, "seed": args.seed}
    if args.threads:
        base["n_threads"] = args.threads
    if args.rpc:
        base["rpc_servers"] = [e.strip() for given in args.rpc for e in given.split(",") if e.strip()]
    if args.n_batch:
        base["n_batch"] = args.n_batch
    if args.flash_attn:
        base["flash_attn_type"] = args.flash_attn
    base.update(_draft_params(args))
    files = args.model or ([] if args.models_dir else [default_model(args.catalog)])
    aliases = args.alias or []
    if len(files) == 1 and len(aliases) > 1:  # llama-server's one model: each -a adds names to it
        aliases = [",".join(aliases)]
    if len(aliases) > len(files):
        raise InvalidParameterError(f"{len(aliases)} --alias for {len(files)} -m: give one --alias after each -m "
                                    "it names", field="alias")
    if args.mmproj and len(files) != 1:
        raise InvalidParameterError("--mmproj goes with one -m; in a models dir, give each model's in models.toml",
                                    field="mmproj")
    template, chat = chat_settings(args)
    skipping = lambda message: print(f"warning: {message}", file=sys.stderr)  # noqa: E731  (at any --log)
    specs = specs_from_dir(args.models_dir, base, skipping) if args.models_dir else []
    specs += [spec_for_file(f, base, aliases[i] if i < len(aliases) else None, mmproj=args.mmproj,
                            pooling=args.pooling, chat_template=template, tags=args.tags) for i, f in enumerate(files)]
    defaults = _request_defaults(args)
    if defaults:
        import dataclasses

        specs = [dataclasses.replace(spec, sampling=defaults) for spec in specs]
    if args.ray:
        if len(specs) != 1:
            raise InvalidParameterError("--ray serves one model (one -m); several models on Ray are not supported yet",
                                        field="ray")
        _started()
        return _serve_on_ray(specs[0].params, args)
    if args.port == 0 and sum(not h.strip().endswith(".sock") for h in args.host.split(",") if h.strip()) > 1:
        raise InvalidParameterError("--port 0 takes one TCP address in --host (each would get another port)",
                                    field="port")
    from .server.listen import sockets

    bound = sockets(args.host, args.port)  # before the load: a busy port is said now, not after it
    loading = None
    if len(specs) == 1:  # one model: load it now, so a bad file fails here rather than at the first request
        from .server import preload

        # The load (native code, the GIL released) runs while the registry, the routes and the web stack
        # import: /health is ready sooner. (Off the main thread the core leaves Ctrl-C alone, as uvicorn takes
        # it over anyway.)
        loading = preload.start(specs[0].params)
    from .server.registry import ModelRegistry

    registry = ModelRegistry(specs=specs, max_loaded=args.max_loaded, keep_alive=args.keep_alive,
                             sleep_idle=args.sleep_idle, max_queue=args.max_queue, chat=chat)
    import time

    from .server.access_log import AccessLog
    from .server.app import create_app_for
    from .server.cors import Cors
    from .server.http_limits import uvicorn_options
    from .server.listen import serve_on

    if loading is not None:
        llama = registry.preload(specs[0].id, loading.result()).llama
        serve_log.log.info("loaded %s: %d slots of %d tokens", specs[0].params.model_path, args.parallel,
                           llama.engine.n_ctx_seq)
    else:
        serve_log.log.info("%d models, each loaded when first asked for: %s", len(specs),
                           ", ".join(s.id for s in specs))
    cors = Cors.serving(args.cors_origins, args.cors_methods, args.cors_headers, args.cors_credentials, args.api_key)
    app = create_app_for(registry, args.api_key, n_predict=args.n_predict, slot_save_path=args.slot_save_path,
                         max_body=args.max_body_mib * 2**20, cors=cors, endpoint_slots=args.endpoint_slots,
                         webui=args.webui)
    # a line per request, ours (uvicorn's has no duration), and the last line once the app's shutdown is done
    app.add_middleware(AccessLog, stopped=lambda: serve_log.stopped(time.monotonic() - began,
                                                                    app.state.metrics.http_requests))
    from .server.request_limits import RequestLimits

    app.state.request_limits = RequestLimits(args.max_messages, args.max_chars, args.max_inputs)
    # uvicorn's loggers go to the handler serve_log set up (log_config None: uvicorn leaves logging alone)
    options = {**uvicorn_options(args.max_header_kib * 1024), "log_level": "info" if args.verbose else "warning",
               "access_log": False, "log_config": None}
    _started()
    # SIGTERM or Ctrl-C: running requests get --shutdown-timeout seconds, then end with an error event (shutdown.py)
    grace = args.shutdown_timeout
    for sock in bound:  # connections wait in the backlog from now until uvicorn's loop accepts them
        sock.listen(2048)  # uvicorn's backlog
    serve_log.listening(bound, args.api_key)
    began = time.monotonic()
    serve_on(app, bound, grace=grace, **options)
    return 0


def _serve_on_ray(params: LlamaParams, args: argparse.Namespace) -> int:
    from .errors import InvalidParameterError

    try:
        from .integrations import ray as on_ray
    except ImportError as exc:
        raise InvalidParameterError(f'`llamaplug serve --ray` needs Ray Serve: pip install "llamaplug[ray]" '
                                    f"({exc.name} is missing)") from None
    template, chat = chat_settings(args)
    print(f"llamaplug serve on Ray ({args.ray_address or 'a local cluster'}): {args.replicas} replicas on "
          f"http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    on_ray.run(params, replicas=args.replicas, address=args.ray_address, host=args.host, port=args.port,
               threads=args.threads, model_id=(args.alias or [None])[0], api_key=args.api_key, pooling=args.pooling,
               app_options={"n_predict": args.n_predict, "slot_save_path": args.slot_save_path,
                            "chat_template": template, "chat": chat, "max_body": args.max_body_mib * 2**20})
    return 0


INSPECT_JSON = """--json prints one JSON document:
  file: {path, size, version, alignment, data_offset, n_kv, n_tensors}
  metadata: {KEY: {type, value}}; an array: {type: "array", element_type, count,
             values: the first 16 (all with --all; null past 4M items)}
  tensors: [{name, type, shape (ggml order, ne[0] first), offset (in the file), n_elements, n_bytes}]
  totals: {n_tensors, n_parameters, n_bytes, by_type: {TYPE: {tensors, parameters, bytes}}}
  vocabulary: {model, pre, n_tokens, n_merges, special: {NAME: {id, text}}, flags: {NAME: bool},
               token_types: {TYPE: count}}, or null
  chat_templates: {"default" (tokenizer.chat_template) or NAME (tokenizer.chat_template.NAME): template}"""


def _file_or_catalog(model: str) -> str | Path:
    """`model` as a file, or a catalog model's name (`llamaplug info` lists them) when no such file exists."""
    from .catalog import default_model, entries

    if not Path(model).exists() and any(e.name == model for e in entries()):
        return default_model(model)
    return model


def cmd_inspect(args: argparse.Namespace) -> int:
    from .blocks.gguf_info import ARRAY_HEAD, read_gguf_info

    info = read_gguf_info(_file_or_catalog(args.model))
    if args.json:
        json.dump(info.to_json(array_items=None if args.all else ARRAY_HEAD), sys.stdout, ensure_ascii=False,
                  indent=2)
        sys.stdout.write("\n")
        return 0
    for line in _inspect_report(info, None if args.all else args.tensors):
        print(line)
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _short(value: object, width: int = 72) -> str:
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, float):
        text = f"{value:.8g}"  # float32 values: no digits past their precision
    else:
        text = str(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def _model_summary(info: GgufInfo) -> list[str]:
    """The architecture and the quantization by name (general.file_type is only a number)."""
    arch = info.metadata.get("general.architecture")
    ftype = info.metadata.get("general.file_type")
    parts = [f"architecture {arch.value}"] if arch is not None else []
    if ftype is not None and isinstance(ftype.value, int):
        from .blocks.quantize import ftype_name

        parts.append(f"quantization {ftype_name(ftype.value)} (general.file_type {ftype.value})")
    return [f"  {', '.join(parts)}"] if parts else []


def _inspect_report(info: GgufInfo, max_tensors: int | None) -> list[str]:
    templates = info.chat_templates()
    lines = [f"file: {info.path}",
             f"  {info.size:,} bytes ({_mib(info.size)}), GGUF v{info.version}, {len(info.metadata)} keys, "
             f"{len(info.tensors)} tensors, alignment {info.alignment}, tensor data at byte {info.data_offset:,}",
             *_model_summary(info), "", f"metadata ({len(info.metadata)} keys):"]
    width = max((len(k) for k in info.metadata), default=0)
    for key, value in info.metadata.items():
        if value.type == "array":
            shown = "(not read)" if value.value is None else ", ".join(_short(v, 24) for v in value.value[:8])
            more = ", ..." if value.count > 8 and value.value is not None else ""
            text = f"[{value.element_type} x {value.count}] {shown}{more}"
        elif key == "tokenizer.chat_template" or key.startswith("tokenizer.chat_template."):
            text = f"string, {len(value.value)} characters (chat template, below)"
        else:
            text = _short(value.value)
        lines.append(f"  {key:{width}}  {text}")
    lines += ["", f"tensors ({len(info.tensors)}, {info.n_parameters:,} parameters, {info.n_bytes:,} bytes):"]
    shown_tensors = info.tensors if max_tensors is None else info.tensors[:max_tensors]
    width = max((len(t.name) for t in shown_tensors), default=4)
    lines.append(f"  {'name':{width}}  {'type':7}  {'shape':20}  {'bytes':>12}")
    for t in shown_tensors:
        shape = " x ".join(str(d) for d in t.shape)
        lines.append(f"  {t.name:{width}}  {t.type:7}  {shape:20}  {t.n_bytes:>12,}")
    if len(shown_tensors) < len(info.tensors):
        lines.append(f"  ... {len(info.tensors) - len(shown_tensors)} more (--tensors N or --all)")
    lines.append("  by type:")
    for name, total in info.by_type().items():
        lines.append(f"    {name:7}  {total.tensors:5} tensors  {total.parameters:>14,} parameters  "
                     f"{total.bytes:>14,} bytes")
    vocab = info.vocabulary()
    lines += ["", "vocabulary:"]
    if vocab is None:
        lines.append("  none (no tokenizer.ggml.tokens)")
    else:
        merges = f", {vocab.n_merges:,} merges" if vocab.n_merges is not None else ""
        lines.append(f"  model {vocab.model}, pre {vocab.pre}, {vocab.n_tokens:,} tokens{merges}")
        if vocab.special:
            lines.append("  special: " + ", ".join(f"{name} {tok.id} {_short(tok.text, 32)}"
                                                   for name, tok in vocab.special.items()))
        if vocab.flags:
            lines.append("  flags: " + ", ".join(f"{name} {value}" for name, value in vocab.flags.items()))
        if vocab.token_types:
            lines.append("  token types: " + ", ".join(f"{name} {n:,}" for name, n in vocab.token_types.items()))
    if not templates:
        lines += ["", "chat template: none"]
    for name, template in templates.items():
        lines += ["", f"chat template ({name}, {len(template)} characters):", template]
    return lines


def cmd_quantize(args: argparse.Namespace) -> int:
    from .blocks.quantize import quantize

    out = quantize(args.src, args.dst, args.type, imatrix=args.imatrix, threads=args.threads,
                   allow_requantize=args.allow_requantize, leave_output_tensor=args.leave_output_tensor,
                   pure=args.pure, quiet=args.quiet)
    if not args.quiet:
        print(f"wrote {out} ({_mib(out.stat().st_size)})", file=sys.stderr)
    return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


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
    from .server.durations import seconds

    try:
        return seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_rpc_server(args: argparse.Namespace) -> int:
    import logging
    import signal

    from .blocks.backend import LlamaBackend

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("llamaplug.rpc").warning(
            "RPC has no authentication: anyone who reaches %s:%d can run graphs and read memory here",
            args.host, args.port)
        print(f"warning: serving on {args.host}, not loopback; RPC has no authentication", file=sys.stderr)
    backend = LlamaBackend.init(backends=["rpc"])
    print(f"llamaplug rpc-server on {args.host}:{args.port}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the server loop is native: let Ctrl-C end the process
    backend.rpc_start_server(args.host, args.port, args.threads)
    return 0


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: a flag it does not know is its error, with its usage (argparse leaves unknown flags
    to the top-level parser, whose usage says nothing of the command's flags)."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def,override]
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llamaplug", description="GGUF models on llama.cpp")
    p.add_argument("--version", action="version", version=f"llamaplug {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    info = sub.add_parser("info", help="versions, backend plugins with probe verdicts, devices, models")
    info.add_argument("--mmproj", help="a multimodal projector GGUF: say whether it takes images and audio")
    info.set_defaults(func=cmd_info)
    run = sub.add_parser("run", help="stream a completion")
    run.add_argument("prompt", nargs="+", metavar="[MODEL] PROMPT",
                     help='MODEL: a GGUF file or a Hugging Face repo "org/repo[:TAG]" (TAG: Q4_K_M, Q8_0, ...; '
                          'pip install "llamaplug[hub]")')
    run.add_argument("-m", "--model", help="GGUF file or org/repo[:TAG] (default: the first installed catalog "
                                           "model)")
    run.add_argument("--catalog", help="catalog model name (see `llamaplug info`)")
    run.add_argument("-n", "--n-predict", type=int, default=64)
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
                      help='a GGUF file or a Hugging Face repo "org/repo[:TAG]" (default: the first installed '
                           "catalog model)")
    chat.add_argument("-m", "--model", help="the same as MODEL")
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
    serve.add_argument("-m", "--model", action="append", help="GGUF file (default: the first installed catalog "
                       "model); repeat it to serve several, each loaded when first asked for")
    serve.add_argument("--catalog", help="catalog model name (see `llamaplug info`)")
    serve.add_argument("-a", "--alias", action="append", help="the model id clients use for the -m before it "
                       "(default: the file name); comma-separated: its other names too, the first (sorted) the id, as "
                       "llama-server's. With one -m, every -a names it")
    serve.add_argument("--models-dir", metavar="DIR", help="serve every *.gguf in DIR, each loaded when first asked "
                       "for; DIR/models.toml may give a model's n_ctx, n_seq_max, mmproj, chat_template, aliases")
    serve.add_argument("--max-loaded", "--models-max", dest="max_loaded", type=_positive, metavar="N",
                       help="models loaded at once: loading one more unloads the least recently used")
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
    serve.add_argument("-np", "--parallel", type=int, default=4, help="slots: requests decoded together")
    serve.add_argument("-c", "--ctx-size", type=int, default=8192, help="KV cache positions, shared by the slots")
    serve.add_argument("--cache-ram", type=int, default=256, metavar="MIB",
                       help="host memory for the KV of finished sequences, reused by later prompts with the same "
                            "prefix (0 = off)")
    serve.add_argument("-b", "--batch-size", dest="n_batch", type=int, help="tokens per decode (n_batch)")
    serve.add_argument("-t", "--threads", type=int)
    serve.add_argument("-s", "--seed", type=int, default=0xFFFFFFFF, help="seed for requests that give none")
    serve.add_argument("--mmproj", help="multimodal projector GGUF: image/audio chat parts (llamaplug-mtmd)")
    serve.add_argument("--pooling", choices=["mean", "cls", "last"],
                       help="for /v1/embeddings (default: the model's own; mean where it has none)")
    serve.add_argument("--api-key", type=_api_key,
                       help="require `Authorization: Bearer KEY` on every route but /health (401 otherwise)")
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
    from .serve_flags import add_llama_server_flags

    add_llama_server_flags(serve)  # last: llama-server's flags that are not ours become errors naming them
    serve.set_defaults(func=cmd_serve)
    tokenizer = sub.add_parser("tokenizer", help="tokenizer tools (plugin llamaplug-tokenizer-hf)")
    groups = {"tokenizer": tokenizer.add_subparsers(dest="tokenizer_command", required=True)}
    from .bench import add_parser
    from .model_commands import add_model_commands

    add_parser(sub)
    add_model_commands(sub)
    _add_plugin_commands(sub, groups)
    return p


# Commands that plugins add, with what to install when none did: the command then says so.
MISSING_PLUGIN_COMMANDS = {
    "tokenizer export": (TokenizerError, "the tokenizer plugin: pip install llamaplug-tokenizer-hf"),
}


def _add_plugin_commands(sub: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    """The commands plugins register (hook llamaplug_register_commands); a name already taken stays the first's."""
    from . import plugins
    from .plugin_api import Command

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


# Whether main() holds the collector off until serve's app is built (not where the process had it off already).
_held_for_serve = False


def _started() -> None:
    """The end of serve's start: the collector runs again (see main), and never scans what the start made (the
    modules, the classes, the loaded model: a server's, they live for good)."""
    global _held_for_serve
    if _held_for_serve:
        _held_for_serve = False
        gc.freeze()
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    global _held_for_serve
    import os

    # A start (the plugins, the imports, a server's routes) allocates enough for ~200 collections, 0.1 s
    # of `serve`'s 1 s to ready, that find next to nothing to free: the collector waits until it is done.
    collecting = gc.isenabled()  # main() may be called in a process that chose otherwise
    gc.disable()
    try:
        args = parser().parse_args(argv)
    finally:
        if collecting:
            gc.enable()
    if collecting and args.func is cmd_serve:
        gc.disable()  # cmd_serve calls _started() once its app is built
        _held_for_serve = True
    level = getattr(args, "log", None) or os.environ.get("LLAMAPLUG_LOG")
    if level and level != "none":  # the CLI owns the terminal: show what the library logs
        logging.basicConfig(level=level.upper(), format="%(name)s: %(message)s", stream=sys.stderr)
    try:
        return args.func(args)
    except LlamaError as exc:
        print(f"llamaplug: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `llamaplug inspect --json | head`: the reader left; no traceback
        import os as _os

        devnull = _os.open(_os.devnull, _os.O_WRONLY)
        _os.dup2(devnull, sys.stdout.fileno())  # Python flushes stdout at exit: into nowhere, not the closed pipe
        return 141
    finally:
        _held_for_serve = False
        if collecting:
            gc.enable()  # a serve that failed before its app was built


if __name__ == "__main__":
    sys.exit(main())
