"""`llamaplug info`: the versions, the backend plugins with their probes' verdicts, the devices, the catalog."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import __version__
from ..errors import LlamaError


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def cmd_info(args: argparse.Namespace) -> int:
    from .. import GGML_VERSION, LLAMA_CPP_COMMIT, catalog, plugins
    from ..blocks.backend import LlamaBackend

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
