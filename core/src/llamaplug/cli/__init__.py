"""The `llamaplug` command: `info`, `run`, `chat`, `serve`, ...; plugins add theirs (hook
llamaplug_register_commands). One module a job: the command line (parser.py), the entry point (entry.py), the
commands by group (info.py, run.py, serve.py, gguf.py, model_commands.py, bench's), what they read from their
arguments (options.py), serve's log (serve_log.py)."""

from __future__ import annotations

from .entry import main
from .gguf import cmd_inspect, cmd_quantize
from .info import cmd_info
from .options import chat_settings, draft_params
from .parser import MISSING_PLUGIN_COMMANDS, parser
from .run import cmd_chat, cmd_run, model_path
from .serve import cmd_rpc_server, cmd_serve
from .startup import started

# The names these had in the one module the CLI was (tests and scripts use them).
_draft_params = draft_params
_started = started

__all__ = ["MISSING_PLUGIN_COMMANDS", "chat_settings", "cmd_chat", "cmd_info", "cmd_inspect", "cmd_quantize",
           "cmd_rpc_server", "cmd_run", "cmd_serve", "draft_params", "main", "model_path", "parser", "started"]
