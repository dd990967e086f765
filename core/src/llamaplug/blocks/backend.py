"""LlamaBackend: the process-wide native state and the compute backends loaded into it."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from .. import plugins
from .._version import GGML_VERSION, LLAMA_CPP_COMMIT
from ..errors import BackendError, BackendMismatchError, InvalidParameterError, NoBackendError, check_ptr
from ..params import NumaStrategy, physical_cores
from ..probes import BackendSpec, ProbeResult
from ..raw import ffi, lib
from . import _native_log

log = logging.getLogger("llamaplug.backend")

@dataclasses.dataclass(frozen=True)
class BackendStatus:
    """One installed backend plugin and what happened to it in this process."""

    name: str
    distribution: str
    priority: int
    ok: bool
    loaded: bool
    reason: str
    variant: str | None = None
    devices: tuple[str, ...] = ()
    mismatch: bool = False  # built from another llama.cpp pin: reinstalling the plugin fixes it


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    name: str
    description: str
    type: str
    memory_free: int
    memory_total: int


_DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


class LlamaBackend:
    """The native backend, initialised once per process; a guard object safe to share between threads.

    `LlamaBackend.init()` returns the same object every time. Closing it (or
    leaving its `with` block) keeps the native state alive: models and contexts
    may still use it, and ggml backends cannot be unloaded while they do.
    """

    _instance: LlamaBackend | None = None
    _lock = threading.RLock()

    def __init__(self, _token: object = None):
        if _token is not _TOKEN:
            raise BackendError("use LlamaBackend.init() or LlamaBackend.init_numa(strategy)")
        self._statuses: list[BackendStatus] = []
        self._rpc_servers: list[str] = []
        self.numa: NumaStrategy | None = None

    @classmethod
    def init(cls, backends: list[str] | None = None) -> LlamaBackend:
        """Initialise llama.cpp and load the backends whose probes pass (or exactly `backends`)."""
        with cls._lock:
            if cls._instance is None:
                instance = cls(_TOKEN)
                _native_log.install()
                _catch_sigint()
                # The plugins' modules first, by absolute path: with a backend registered,
                # llama_backend_init never runs ggml's module search (which the core's ggml is
                # also built to skip: a libggml-*.so in the working directory would run).
                instance._statuses = _load_backends(backends) + _trusted_env_module()
                lib.llama_backend_init()
                cls._instance = instance
            elif backends:
                cls._instance._require(backends)
            return cls._instance

    @classmethod
    def init_numa(cls, strategy: NumaStrategy) -> LlamaBackend:
        backend = cls.init()
        strategy = NumaStrategy(strategy)
        with cls._lock:
            if backend.numa is None:
                lib.llama_numa_init(int(strategy))
                backend.numa = strategy
            elif backend.numa != strategy:
                raise BackendError(
                    f"NUMA already initialised with {backend.numa.name}, cannot switch to {strategy.name}"
                )
        return backend

    @classmethod
    def initialised(cls) -> bool:
        return cls._instance is not None

    def _require(self, names: list[str]) -> None:
        for name in names:
            status = next((s for s in self._statuses if s.name == name), None)
            if status is None:
                raise NoBackendError(f"backend {name!r} is not installed: pip install llamaplug-backend-{name}")
            if not status.loaded:
                raise BackendError(f"backend {name!r} cannot run here: {status.reason}")

    def __enter__(self) -> LlamaBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to free early: the native state lives as long as the process (see class doc)."""

    # -- capability probes -------------------------------------------------
    def supports_gpu_offload(self) -> bool:
        return bool(lib.llama_supports_gpu_offload())

    def supports_mmap(self) -> bool:
        return bool(lib.llama_supports_mmap())

    def supports_mlock(self) -> bool:
        return bool(lib.llama_supports_mlock())

    def supports_rpc(self) -> bool:
        return bool(lib.llama_supports_rpc())

    def max_devices(self) -> int:
        return int(lib.llama_max_devices())

    def system_info(self) -> str:
        return ffi.string(lib.llama_print_system_info()).decode().strip()

    def add_rpc_server(self, endpoint: str) -> None:
        """Make the devices of the RPC server at "host:port" available (needs llamaplug-backend-rpc)."""
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidParameterError(f"RPC server must be host:port, got {endpoint!r}", field="rpc_servers")
        with self._lock:
            if endpoint in self._rpc_servers:
                return
            reg = check_ptr(lib.ggml_backend_reg_by_name(b"RPC"), NoBackendError,
                            f"RPC server {endpoint} needs the RPC backend: pip install llamaplug-backend-rpc")
            add = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
            add_server = ffi.cast("ggml_backend_reg_t (*)(const char *)", add)
            with _native_log.capture_errors() as errors:
                server_reg = add_server(endpoint.encode())
            check_ptr(server_reg, BackendError, f"could not reach RPC server {endpoint}", errors)
            lib.ggml_backend_register(server_reg)
            self._rpc_servers.append(endpoint)

    @property
    def rpc_servers(self) -> list[str]:
        """The RPC servers whose devices are registered (every later model load may use them)."""
        return list(self._rpc_servers)

    def check_rpc_servers(self, timeout: float = 2.0) -> None:
        """Raise BackendError naming a registered RPC server that does not take a connection now.

        A load checks them first, so a stopped server is an error naming it (ggml-rpc itself aborted the
        process, "Failed to connect"; patched, it fails the load with an allocation error), and a load once
        it is back works again.
        """
        for endpoint in self.rpc_servers:
            host, _, port = endpoint.rpartition(":")
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
            except OSError as exc:
                raise BackendError(f"the RPC server {endpoint} does not answer ({exc}); its devices are "
                                   "registered for this process's models: start it again") from None

    def rpc_watch(self) -> Callable[[], str | None] | None:
        """A check for the decodes of a context made now: it names the registered RPC server whose connection
        broke (None while all hold). None when no RPC server is registered (nothing to check).

        ggml-rpc's commands are asynchronous: the decode during which a server dies returns success, and what it
        read from the server (the logits) are zeros. A decode on RPC devices synchronizes and asks this before
        its outputs are used (vendor/llama.cpp/patches/0003-ggml-rpc-a-lost-connection-is-an-error.patch).
        """
        endpoints = [e.encode() for e in self.rpc_servers]
        reg = lib.ggml_backend_reg_by_name(b"RPC") if endpoints else ffi.NULL
        fn = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_connection_lost") if reg else ffi.NULL
        if fn == ffi.NULL:
            return None
        lost = ffi.cast("bool (*)(const char *)", fn)

        def check() -> str | None:
            return next((e.decode() for e in endpoints if lost(e)), None)

        return check

    def rpc_start_server(self, host: str, port: int, n_threads: int = 0) -> None:
        """Serve this process's local devices over RPC; blocks until the process ends."""
        reg = check_ptr(lib.ggml_backend_reg_by_name(b"RPC"), NoBackendError,
                        "the RPC server needs the RPC backend: pip install llamaplug-backend-rpc")
        start = ffi.cast("void (*)(const char *, const char *, size_t, size_t, ggml_backend_dev_t *)",
                         lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_start_server"))
        local = [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]
        local = [d for d in local if lib.ggml_backend_dev_backend_reg(d) != reg]
        devices = ffi.new("ggml_backend_dev_t[]", local)
        start(f"{host}:{port}".encode(), ffi.NULL, n_threads or physical_cores(), len(local), devices)

    def backends(self) -> list[BackendStatus]:
        return list(self._statuses)

    def offload_devices(self) -> list[str]:
        """Names of the devices layers can be offloaded to (every device but the CPU)."""
        return [d.name for d in self.devices() if d.type != "cpu"]

    def devices(self) -> list[DeviceInfo]:
        found = []
        free, total = ffi.new("size_t *"), ffi.new("size_t *")
        for i in range(lib.ggml_backend_dev_count()):
            dev = lib.ggml_backend_dev_get(i)
            lib.ggml_backend_dev_memory(dev, free, total)
            found.append(DeviceInfo(
                name=ffi.string(lib.ggml_backend_dev_name(dev)).decode(),
                description=ffi.string(lib.ggml_backend_dev_description(dev)).decode(),
                type=_DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "unknown"),
                memory_free=int(free[0]), memory_total=int(total[0]),
            ))
        return found


_TOKEN = object()

# ggml reads GGML_BACKEND_PATH (one more module to load) in its module search; the core's ggml
# is built without that search, so the variable counts only where this setting says so.
TRUST_ENV = "LLAMAPLUG_TRUST_GGML_BACKEND_PATH"


def _trusted_env_module() -> list[BackendStatus]:
    path = os.environ.get("GGML_BACKEND_PATH")
    if not path:
        return []
    if os.environ.get(TRUST_ENV) != "1":
        log.warning("GGML_BACKEND_PATH=%s is ignored: set %s=1 to load that module into this process",
                    path, TRUST_ENV)
        return [BackendStatus("GGML_BACKEND_PATH", path, 0, ok=False, loaded=False,
                              reason=f"ignored: set {TRUST_ENV}=1 to load it")]
    module = Path(path)
    if not module.is_absolute() or not module.is_file():
        raise BackendError(f"GGML_BACKEND_PATH={path} must be the absolute path of a ggml backend module file")
    with _native_log.capture_errors() as errors:
        reg = lib.ggml_backend_load(str(module).encode())
    check_ptr(reg, BackendError, f"ggml could not load GGML_BACKEND_PATH={path}", errors)
    log.warning("loaded %s from GGML_BACKEND_PATH (%s=1)", path, TRUST_ENV)
    return [BackendStatus("GGML_BACKEND_PATH", path, 0, ok=True, loaded=True, reason=f"trusted by {TRUST_ENV}=1")]


def _catch_sigint() -> None:
    """Let Ctrl-C abort a running decode (only where Python's default SIGINT handling is in place)."""
    import signal

    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        lib.llamaplug_install_sigint()


def _requested(explicit: list[str] | None) -> list[str] | None:
    if explicit:
        return list(explicit)
    env = os.environ.get("LLAMAPLUG_BACKENDS")
    return [n.strip() for n in env.split(",") if n.strip()] if env else None


def _verdict(spec: BackendSpec) -> ProbeResult:
    if (spec.llama_cpp_commit, spec.ggml_version) != (LLAMA_CPP_COMMIT, GGML_VERSION):
        return ProbeResult(False, (
            f"built from llama.cpp {spec.llama_cpp_commit} (ggml {spec.ggml_version}), but llamaplug "
            f"{LLAMA_CPP_COMMIT} (ggml {GGML_VERSION}) needs the same pin: reinstall {spec.distribution}"
        ), mismatch=True)
    try:
        return spec.probe()
    except Exception as exc:  # a probe's failure is a verdict, never a crash of the caller
        return ProbeResult(False, f"probe failed: {type(exc).__name__}: {exc}")


def probe_ahead() -> None:
    """Start the installed backends' probes now, in a thread: a probe that needs a child interpreter then runs
    while the caller goes on (a server imports its web stack meanwhile), and `LlamaBackend.init` finds the
    verdicts made or being made (`probes.isolated` runs each child once)."""
    if LlamaBackend.initialised():
        return

    def run() -> None:
        try:
            wanted = _requested(None)
            for spec in plugins.backend_specs():
                if wanted is None or spec.name in wanted or spec.name == "cpu":
                    threading.Thread(target=_verdict, args=(spec,), daemon=True).start()
        except Exception:  # noqa: BLE001 - LlamaBackend.init meets the same failure and reports it
            log.debug("probing ahead failed", exc_info=True)

    threading.Thread(target=run, name="llamaplug-probe-ahead", daemon=True).start()


def _load_backends(explicit: list[str] | None) -> list[BackendStatus]:
    specs = plugins.backend_specs()
    if not specs:
        raise NoBackendError(
            "no compute backend plugin is installed: pip install llamaplug-backend-cpu "
            "(and llamaplug-backend-cuda / -vulkan / ... for a GPU)"
        )
    wanted = _requested(explicit)
    asked = [s for s in specs if wanted is None or s.name in wanted or s.name == "cpu"]
    from concurrent.futures import ThreadPoolExecutor

    # Probes that start a child process run side by side: startup costs the slowest, not the sum.
    with ThreadPoolExecutor(max_workers=len(asked) or 1) as pool:
        verdicts = dict(zip([s.name for s in asked], pool.map(_verdict, asked)))
    statuses = []
    served: dict[str, str] = {}  # device -> the backend already using it
    for spec in specs:  # highest priority first
        if wanted is not None and spec.name not in wanted and spec.name != "cpu":
            # Probes can cost a child process; an unwanted backend is not asked.
            why = "not probed: not selected (LlamaParams.backends / LLAMAPLUG_BACKENDS)"
            statuses.append(BackendStatus(spec.name, spec.distribution, spec.priority, ok=False, loaded=False,
                                          reason=why))
            continue
        verdict = verdicts[spec.name]
        # CPU always loads: llama.cpp needs it for host buffers and unsupported ops.
        chosen = verdict.ok and (wanted is None or spec.name in wanted or spec.name == "cpu")
        reason = verdict.reason
        if chosen and wanted is None and spec.name != "cpu" and verdict.devices \
                and all(d in served for d in verdict.devices):
            # One physical GPU seen through two APIs (CUDA and Vulkan, say): use the preferred one only.
            chosen = False
            reason = f"{reason}; its devices are already used through {served[verdict.devices[0]]}"
        if chosen:
            for module in verdict.modules:
                if lib.ggml_backend_load(str(module).encode()) == ffi.NULL:
                    chosen, reason = False, f"ggml could not load {module}"
                    break
        if chosen and spec.name != "cpu":
            served.update(dict.fromkeys(verdict.devices, spec.name))
        statuses.append(BackendStatus(
            name=spec.name, distribution=spec.distribution, priority=spec.priority, ok=verdict.ok,
            loaded=chosen, reason=reason, variant=verdict.variant, devices=verdict.devices, mismatch=verdict.mismatch,
        ))
        log.info("backend %s: %s (%s)", spec.name, "loaded" if chosen else "not loaded", reason)
    by_name = {s.name: s for s in statuses}
    for name in wanted or []:
        if name not in by_name:
            raise NoBackendError(
                f"backend {name!r} was requested but is not installed: pip install llamaplug-backend-{name}"
            )
        if not by_name[name].loaded:
            raise (BackendMismatchError if by_name[name].mismatch else BackendError)(
                f"backend {name!r} was requested but cannot run here: {by_name[name].reason}"
            )
    cpu = by_name.get("cpu")
    if cpu is None or not cpu.loaded:
        why = cpu.reason if cpu else "llamaplug-backend-cpu is not installed"
        error = BackendMismatchError if cpu and cpu.mismatch else NoBackendError
        raise error(f"the CPU backend is required and could not be loaded: {why} (pip install llamaplug-backend-cpu)")
    return statuses
