"""`llamaplug`'s entry point: parse, run the command, say a LlamaError in one line."""

from __future__ import annotations

import gc
import logging
import sys

from ..errors import LlamaError
from . import startup
from .parser import parser
from .serve import cmd_serve


def main(argv: list[str] | None = None) -> int:
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
        startup.hold()  # cmd_serve calls startup.started() once its app is built
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
        startup.release()
        if collecting:
            gc.enable()  # a serve that failed before its app was built
