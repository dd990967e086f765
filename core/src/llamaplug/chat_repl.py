"""`llamaplug chat MODEL`: an interactive chat in the terminal, as `ollama run` and `llama-cli` have.

Each line is a user turn; the reply streams as it is generated and the conversation is kept
(history) until /clear. Lines starting with / are commands (/help lists them). A reply's
reasoning (<think>...</think>) is shown dimmed on a terminal. Ctrl-C stops a reply; Ctrl-C twice
at the prompt, Ctrl-D or /bye leave. Without a terminal on stdin (a pipe, a test), the lines are
read as they come and no prompt is printed.
"""

from __future__ import annotations

import sys
from typing import IO, Any

HELP = """commands:
  /bye, /exit, /quit  leave (Ctrl-D too)
  /clear              forget the conversation (the system prompt stays)
  /system TEXT        set the system prompt (and clear the conversation)
  /help, /?           this list
Ctrl-C stops a reply (twice at the prompt: leave); a line ending in \\ continues on the next line."""

DIM, RESET = "\033[2m", "\033[0m"
OPEN, CLOSE = "<think>", "</think>"


class ReasoningPrinter:
    """Writes a streamed reply, the <think>...</think> part dimmed (tags dropped) when `dim` is set.

    A tag may be split over two deltas: the tail that could start one is held until the next.
    """

    def __init__(self, out: IO[str], dim: bool):
        self.out, self.dim = out, dim
        self.held = ""
        self.thinking = False

    def write(self, text: str) -> None:
        text = self.held + text
        self.held = ""
        while text:
            tag = CLOSE if self.thinking else OPEN
            at = text.find(tag)
            if at >= 0:
                self._emit(text[:at])
                self.thinking = not self.thinking
                if self.dim:
                    self.out.write(DIM if self.thinking else RESET)
                else:
                    self.out.write(tag)
                text = text[at + len(tag):]
                continue
            keep = next((k for k in range(min(len(tag) - 1, len(text)), 0, -1) if tag.startswith(text[-k:])), 0)
            self._emit(text[:len(text) - keep])
            self.held = text[len(text) - keep:]
            break
        self.out.flush()

    def finish(self) -> None:
        self._emit(self.held)
        self.held = ""
        if self.thinking and self.dim:
            self.out.write(RESET)
        self.thinking = False
        self.out.write("\n")
        self.out.flush()

    def _emit(self, text: str) -> None:
        if text:
            self.out.write(text)


def read_turn(stdin: IO[str], prompt: str | None) -> str | None:
    """The next user turn (lines ending in \\ joined), or None at the end of input."""
    lines = []
    while True:
        try:
            line = input(prompt if not lines else "... ") if prompt is not None else stdin.readline()
        except EOFError:
            return None
        if prompt is None and not line:
            return None if not lines else "\n".join(lines)
        line = line.rstrip("\n")
        if line.endswith("\\"):
            lines.append(line[:-1])
            continue
        lines.append(line)
        return "\n".join(lines)


def repl(llama: Any, sampling: dict[str, Any], max_tokens: int | None = None, system: str | None = None,
         stdin: IO[str] | None = None, out: IO[str] | None = None, mcp: Any = None) -> int:
    """Chat with `llama` until /bye or the end of input; `sampling` are create_chat_completion's keywords.
    `mcp`: chat_mcp.McpChat (--mcp-config), whose tools the model may call in each turn."""
    stdin = stdin or sys.stdin
    out = out or sys.stdout
    interactive = stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401 - input() gets line editing and history (arrow keys)
        except ImportError:
            pass
        out.write(f"chatting with {llama.params.model_path.name}: /help for commands, /bye or Ctrl-D to leave\n")
    prompt = ">>> " if interactive else None
    printer = ReasoningPrinter(out, dim=out.isatty())
    history: list[dict[str, Any]] = []
    warned = False  # a Ctrl-C at the prompt said how to leave: a second one in a row leaves
    while True:
        try:
            text = read_turn(stdin, prompt)
        except KeyboardInterrupt:
            # Ollama's hint, then node's habit: one stray Ctrl-C (a reply that ended just before it) keeps the
            # conversation; llama-cli's users press it twice at the prompt to leave
            if warned:
                out.write("\n")
                return 0
            warned = True
            out.write("\n(Ctrl-C again, Ctrl-D or /bye to leave)\n")
            continue
        warned = False
        if text is None:
            if interactive:
                out.write("\n")
            return 0
        if not text.strip():
            continue
        if text.startswith("/"):
            word, _, rest = text.strip().partition(" ")
            if word in ("/bye", "/exit", "/quit"):
                return 0
            if word == "/clear":
                history.clear()
                out.write("(conversation cleared)\n")
            elif word == "/system":
                system = rest.strip() or None
                history.clear()
                out.write("(system prompt set; conversation cleared)\n" if system else "(system prompt removed)\n")
            elif word in ("/help", "/?"):
                out.write(HELP + "\n")
            else:
                out.write(f"unknown command {word}: /help lists them\n")
            continue
        history.append({"role": "user", "content": text})
        messages = ([{"role": "system", "content": system}] if system else []) + history
        try:
            if mcp is not None:  # the calls and their results stay in the conversation
                reply, made = mcp.reply(llama, messages, max_tokens, sampling, printer)
                history[len(history):] = made
            else:
                reply = stream_reply(llama, messages, max_tokens, sampling, printer)
        except KeyboardInterrupt:
            printer.finish()
            out.write("(stopped)\n")
            history.pop()  # the turn had no reply: ask again or go on
            continue
        printer.finish()
        history.append({"role": "assistant", "content": reply})


def stream_reply(llama: Any, messages: list[dict[str, Any]], max_tokens: int | None, sampling: dict[str, Any],
                 printer: ReasoningPrinter, ending: list[Any] | None = None) -> str:
    """Stream the reply to `messages` through `printer` (its thinking between <think> tags, dimmed on a
    terminal); returns its content. Ctrl-C (KeyboardInterrupt) cancels the generation and is raised again.
    `ending` (chat_mcp's rounds) gets each chunk's choice that carries tool calls or a finish_reason."""
    reply = []
    thinking = False  # the chat layer streams the thinking apart (delta.reasoning_content): shown dimmed
    stream = llama.create_chat_completion(messages, max_tokens=max_tokens, stream=True, **sampling)
    try:
        for chunk in stream:
            if ending is not None and chunk.choices and (chunk.choices[0].delta.tool_calls or
                                                         chunk.choices[0].finish_reason):
                ending.append(chunk.choices[0])
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is not None and delta.reasoning_content:
                if not thinking:
                    printer.write(OPEN)
                    thinking = True
                printer.write(delta.reasoning_content)
            piece = delta.content if delta is not None else None
            if piece:
                if thinking:
                    printer.write(CLOSE)
                    thinking = False
                reply.append(piece)
                printer.write(piece)
    except KeyboardInterrupt:
        stream.close()  # cancels the generation: its slot is free at the engine's next step
        raise
    if thinking:
        printer.write(CLOSE)
    return "".join(reply)
