"""`llamaplug serve` (the HTTP server, here or on Ray) and `llamaplug rpc-server` (this machine's devices for
others)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from .options import chat_settings, model_fields, request_defaults
from .run import model_path
from .startup import started

if TYPE_CHECKING:
    from ..params import LlamaParams


class _StoppedLoading(BaseException):
    """SIGTERM or SIGINT while the model loads (raised in the main thread by _stop_loading)."""


def _stop_loading(signum: int, frame: object) -> None:
    raise _StoppedLoading(signum)


class _BadAdapter(Exception):
    """A --lora / --lora-scaled file that is missing, not a GGUF or not an adapter of the model (its message
    names the path: the LlamaError the library raised for it)."""


def _lora(args: argparse.Namespace, n_models: int) -> list[tuple[str, float]]:
    """The adapters of --lora / --lora-scaled in their order (their ids), each file checked before any model
    loads; scale 0 for each with --lora-init-without-apply, as llama-server (set later: POST /lora-adapters)."""
    from ..blocks.gguf_header import inspect_model
    from ..errors import InvalidParameterError, LlamaError

    given = [pair for group in (args.lora or []) for pair in group]
    if not given:
        return []
    if n_models != 1:
        raise InvalidParameterError("--lora goes with one -m (the adapters are of that model)", field="lora")
    for path, _ in given:
        try:
            inspect_model(path)  # missing, unreadable or not a GGUF: named now
        except LlamaError as exc:
            raise _BadAdapter(f"LoRA adapter {path}: {exc}") from None
    return [(path, 0.0 if args.lora_init_without_apply else scale) for path, scale in given]


def cmd_serve(args: argparse.Namespace) -> int:
    import time

    began = time.monotonic()
    try:
        return _serve(args)
    except _BadAdapter as exc:  # as a bad flag: one line, exit 2, before (or instead of) serving
        print(f"llamaplug serve: error: {exc}", file=sys.stderr)
        return 2
    except _StoppedLoading:
        from . import serve_log

        # the line a server that stopped writes; then out at once, not after the load (its thread cannot be
        # stopped, and the interpreter's exit would wait for it): exit 0, as a server stopped by a signal
        serve_log.stopped(time.monotonic() - began, 0)
        os._exit(0)


def _serve(args: argparse.Namespace) -> int:
    from ..catalog import default_model
    from ..errors import InvalidParameterError, LlamaError

    if not args.models_dir and not args.ray:  # the -m models load with the default backends
        from ..blocks.backend import probe_ahead

        probe_ahead()  # the backends' probes run while the web stack imports: /health is ready sooner
    try:
        import importlib.util

        if importlib.util.find_spec("uvicorn") is None:
            raise ImportError(name="uvicorn")
        from ..server.model_specs import spec_for_file, specs_from_dir
    except ImportError as exc:
        raise InvalidParameterError(f'`llamaplug serve` needs the server extra: pip install "llamaplug[server]" '
                                    f"({exc.name} is missing)") from None
    from ..serve_flags import settle

    settle(args)  # LLAMA_ARG_* variables the command line did not override
    if args.offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
        if "huggingface_hub" in sys.modules:  # it reads the variable once, at import
            sys.modules["huggingface_hub"].constants.HF_HUB_OFFLINE = True
    from . import serve_log

    native_log = serve_log.configure(args.log, args.log_format, args.verbose)
    if args.api_key is None and any(h.strip() not in ("127.0.0.1", "localhost", "::1") and not h.endswith(".sock")
                                    for h in args.host.split(",")):
        serve_log.log.warning("serving on %s, not loopback, without --api-key: anyone who reaches it can use it",
                              args.host)
    base: dict[str, object] = {"log_level": native_log, **model_fields(args)}
    given = (args.model or []) + (args.hf_repo or [])
    files = [model_path(m) for m in given] or ([] if args.models_dir or args.models_preset
                                               else [default_model(args.catalog)])
    aliases = args.alias or []
    if not aliases and any(str(f) != g for f, g in zip(files, given)):  # a model given by name: clients use it
        aliases = [g if str(f) != g else None for f, g in zip(files, given)]
    if len(files) == 1 and len(aliases) > 1:  # llama-server's one model: each -a adds names to it
        aliases = [",".join(aliases)]
    if len(aliases) > len(files):
        raise InvalidParameterError(f"{len(aliases)} --alias for {len(files)} -m: give one --alias after each -m "
                                    "it names", field="alias")
    if args.mmproj and len(files) != 1:
        raise InvalidParameterError("--mmproj goes with one -m; in a models dir, give each model's in models.toml",
                                    field="mmproj")
    lora = _lora(args, len(files) + 2 * bool(args.models_dir))
    if lora:  # one model (checked): its params
        base["lora"] = lora
    template, chat = chat_settings(args)
    skipping = lambda message: print(f"warning: {message}", file=sys.stderr)  # noqa: E731  (at any --log)
    specs = specs_from_dir(args.models_dir, base, skipping) if args.models_dir else []
    specs += [spec_for_file(f, base, aliases[i] if i < len(aliases) else None, mmproj=args.mmproj,
                            pooling=args.pooling, chat_template=template, tags=args.tags) for i, f in enumerate(files)]
    defaults = request_defaults(args)
    if defaults:
        import dataclasses

        specs = [dataclasses.replace(spec, sampling=defaults) for spec in specs]
    if args.ray:
        if args.tools:
            raise InvalidParameterError("--tools is not available with --ray (the tools would run on whichever "
                                        "replica's machine answers)", field="tools")
        if len(specs) != 1:
            raise InvalidParameterError("--ray serves one model (one -m); several models on Ray are not supported yet",
                                        field="ray")
        started()
        return _serve_on_ray(specs[0].params, args)
    if args.port == 0 and sum(not h.strip().endswith(".sock") for h in args.host.split(",") if h.strip()) > 1:
        raise InvalidParameterError("--port 0 takes one TCP address in --host (each would get another port)",
                                    field="port")
    from ..server.gcp import Gcp
    from ..server.listen import sockets

    gcp = Gcp.from_env(os.environ)  # llama-server's Google Cloud Platform compat (AIP_MODE=PREDICTION)
    if gcp is not None and gcp.port != args.port:
        serve_log.log.warning("Google Cloud Platform compat: overriding the port %d with AIP_HTTP_PORT %d",
                              args.port, gcp.port)
        args.port = gcp.port
    bound = sockets(args.host, args.port)  # before the load: a busy port is said now, not after it
    presets = None
    if args.models_preset:  # llama-server's INI file of models: read now (a bad one fails here), again at reloads
        from .preset_specs import loader

        read = loader(args.models_preset, args, base, specs)
        presets = (read, read())
    loading = None
    # one model: load it now, so a bad file fails here rather than at the first request
    if len(specs) == 1 and presets is None:
        from ..server import preload

        # The load (native code, the GIL released) runs while the registry, the routes and the web stack
        # import: /health is ready sooner. (Off the main thread the core leaves Ctrl-C alone, as uvicorn takes
        # it over anyway.)
        loading = preload.start(specs[0].params)
        import signal

        # a signal while it loads: the "stopped" line, exit 0 (see cmd_serve), rather than a silent 143 / 130
        stop_handlers = {sig: signal.signal(sig, _stop_loading) for sig in (signal.SIGTERM, signal.SIGINT)}
    from ..server.registry import ModelRegistry

    registry = ModelRegistry(specs=specs, max_loaded=args.max_loaded, keep_alive=args.keep_alive,
                             sleep_idle=args.sleep_idle, max_queue=args.max_queue, chat=chat,
                             autoload=args.models_autoload, presets=presets,
                             router=len(specs) > 1 or bool(args.models_dir or args.models_preset))
    for name in presets[1].startup if presets is not None else ():  # load-on-startup
        registry.preload(name)
    import time

    from ..server.access_log import AccessLog
    from ..server.app import create_app_for
    from ..server.cors import Cors
    from ..server.http_limits import uvicorn_options
    from ..server.listen import serve_on

    if loading is not None:
        try:
            loaded = loading.result()
        except LlamaError as exc:  # an adapter of another model (architecture, shapes): named, exit 2
            if not any(str(path) in str(exc) for path, _ in lora):
                raise
            raise _BadAdapter(str(exc)) from None
        llama = registry.preload(specs[0].id, loaded).llama
        # the engine's own counts: models.toml may give the model its own n_seq_max and n_ctx
        serve_log.log.info("loaded %s: %d slots of %d tokens%s", specs[0].params.model_path, llama.engine.n_slots,
                           llama.engine.n_ctx_seq, " (one KV cache they share)" if args.kv_unified else "")
        for sig, handler in stop_handlers.items():
            signal.signal(sig, handler)
    else:
        serve_log.log.info("%d models, each loaded when first asked for: %s", len(registry.names()),
                           ", ".join(registry.names()))
    origins = args.cors_origins
    mcp = args.mcp_config is not None or args.mcp_json is not None
    if origins is None and (args.tools or mcp):  # llama-server's default with either
        origins = "localhost"
    cors = Cors.serving(origins, args.cors_methods, args.cors_headers, args.cors_credentials, args.api_key)
    app = create_app_for(registry, args.api_key, n_predict=args.n_predict, slot_save_path=args.slot_save_path,
                         max_body=args.max_body_mib * 2**20, cors=cors, endpoint_slots=args.endpoint_slots,
                         webui=args.webui, endpoint_metrics=args.endpoint_metrics, media_path=args.media_path)
    # a line per request, ours (uvicorn's has no duration), and the last line once the app's shutdown is done
    app.add_middleware(AccessLog, stopped=lambda: serve_log.stopped(time.monotonic() - began,
                                                                    app.state.metrics.http_requests))
    from ..server.request_limits import RequestLimits

    app.state.request_limits = RequestLimits(args.max_messages, args.max_chars, args.max_inputs)
    from ..server import response_store

    app.state.responses = response_store.ResponseStore(
        args.responses_db or response_store.default_path(), args.responses_max_age,
        args.responses_max_mib * 2**20) if args.responses_store else None
    app.state.ui_mcp_proxy = args.ui_mcp_proxy
    app.state.verbose = args.verbose  # llama-server's: every reply carries __verbose unless the request says not
    if args.ui_mcp_proxy:
        serve_log.log.warning("--ui-mcp-proxy: /cors-proxy forwards requests to any URL (experimental)")
    from starlette.middleware import Middleware

    from ..server.native import lora as lora_routes

    app.include_router(lora_routes.router)  # llama-server's GET/POST /lora-adapters (an empty list without --lora)
    app.state.lora_scales = [scale for _, scale in lora]  # what POST sets; a request's own `lora` must agree
    # innermost, after the key and the body cap: it reads the body JsonBody has already bounded
    app.user_middleware.append(Middleware(lora_routes.PerRequestLora))
    if args.tools or mcp:  # POST /tools exists only with the flag or MCP servers (their tools too, as llama-server)
        from ..server.builtin_tools.routes import router as tools_router

        app.include_router(tools_router)
        app.state.builtin_tools = args.tools
    if args.tools:
        serve_log.log.warning("--tools %s: /tools reads, writes and runs anything as this user for whoever reaches "
                              "the server (experimental)", ",".join(args.tools))
    if gcp is not None:  # after every other route: @requestFormat names any of them
        from ..server import gcp as gcp_routes

        gcp_routes.install(app, gcp)
    if mcp:  # the servers are started once here to list their tools, then again at a first call and kept
        import asyncio

        from ..high.mcp_tools import McpTools

        # as llama-server: a server that cannot list its tools is left out with a warning, the others serve
        app.state.mcp = asyncio.run(McpTools.from_sources(args.mcp_config, args.mcp_json, keep=True)
                                    .start(skip_failed=True))
        # the first signal ends the tool calls running (a 503) and the servers: a call waits on no engine
        app.state.on_stop = [app.state.mcp.close]
        app.state.mcp_bounds = (args.mcp_max_steps, args.mcp_timeout)
        serve_log.log.info("MCP tools: %s", ", ".join(app.state.mcp.tools) or "none")
    # uvicorn's loggers go to the handler serve_log set up (log_config None: uvicorn leaves logging alone)
    # uvicorn's info lines (started, startup complete, ...) only with --verbose, and never below --log's level
    import logging

    uvicorn_level = max(logging.getLogger().level, logging.INFO if args.verbose else logging.WARNING)
    options = {**uvicorn_options(args.max_header_kib * 1024), "log_level": uvicorn_level,
               "access_log": False, "log_config": None}
    started()
    # SIGTERM or Ctrl-C: running requests get --shutdown-timeout seconds, then end with an error event (shutdown.py)
    grace = args.shutdown_timeout
    for sock in bound:  # connections wait in the backlog from now until uvicorn's loop accepts them
        sock.listen(2048)  # uvicorn's backlog
    serve_log.listening(bound, args.api_key)
    began = time.monotonic()
    serve_on(app, bound, grace=grace, **options)
    return 0


def _serve_on_ray(params: LlamaParams, args: argparse.Namespace) -> int:
    from ..errors import InvalidParameterError

    try:
        from ..integrations import ray as on_ray
    except ImportError as exc:
        raise InvalidParameterError(f'`llamaplug serve --ray` needs Ray Serve: pip install "llamaplug[ray]" '
                                    f"({exc.name} is missing)") from None
    template, chat = chat_settings(args)
    print(f"llamaplug serve on Ray ({args.ray_address or 'a local cluster'}): {args.replicas} replicas on "
          f"http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    on_ray.run(params, replicas=args.replicas, address=args.ray_address, host=args.host, port=args.port,
               threads=args.threads, model_id=(args.alias or [None])[0], api_key=args.api_key, pooling=args.pooling,
               app_options={"n_predict": args.n_predict, "slot_save_path": args.slot_save_path,
                            "chat_template": template, "chat": chat, "max_body": args.max_body_mib * 2**20,
                            "media_path": args.media_path},
               shutdown_timeout_s=args.shutdown_timeout)  # a replica stopped gives its streams this long
    return 0


def cmd_rpc_server(args: argparse.Namespace) -> int:
    import logging
    import signal

    from ..blocks.backend import LlamaBackend

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
