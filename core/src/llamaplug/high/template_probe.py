"""A model's chat template tried once, before it serves: a template that fails, fails at start.

    probe_chat_template(llama, chat_template)   # the template the server will use (None: the model's)

llama-server renders its template at start; llamaplug compiled an override and rendered any template
only at the first chat request, so a template that does not compile, or one that passes a bound of
llama.cpp's Jinja interpreter (recursion depth, nesting, steps, text built, list size: our patch 0004,
where a template would have overflowed the stack or taken gigabytes), passed the start and failed
at a request. Here it is compiled and rendered on a small real conversation; either failure is a
`ChatTemplateError` (naming the bound where one was passed). A template that only raises on these messages
(`raise_exception`, say, where it wants another order of roles) is logged and left to the requests,
which get its message: what it refuses depends on what they send.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import ChatTemplateError, InvalidParameterError
from .chat import ChatSpec, chat_request, chat_templates

if TYPE_CHECKING:
    from .llama import Llama

_log = logging.getLogger("llamaplug.chat")

# The start of what llama.cpp's interpreter throws where a template passes one of its bounds (patch 0004).
BOUND = "chat template bound exceeded"

# Tried in order until one renders: a template may refuse a system message, or want the user to speak first.
PROBES: tuple[list[dict[str, Any]], ...] = (
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello!"},
     {"role": "assistant", "content": "Hi! How can I help?"}, {"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi! How can I help?"},
     {"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "user", "content": "Hello!"}],
)


def passes_bound(exc: BaseException) -> bool:
    """Whether `exc` says a template passed one of the interpreter's bounds."""
    return BOUND in str(exc)


def probe_chat_template(llama: Llama, chat_template: str | None = None) -> None:
    """Compile `chat_template` (None: the model's own) and render it on a small real conversation.

    Raises ChatTemplateError where it does not compile or passes a bound; a template that raises on every
    probe conversation is logged (a warning) and left to the requests."""
    try:
        templates = chat_templates(llama.model, chat_template)
    except InvalidParameterError as exc:  # a built-in name llama.cpp does not know
        raise ChatTemplateError(f"the chat template cannot serve: {exc}") from None
    refused: Exception | None = None
    for messages in PROBES:
        request, _ = chat_request(ChatSpec(messages, chat_template=chat_template), messages)
        try:
            templates.apply(request)
            return
        except (ChatTemplateError, InvalidParameterError) as exc:
            if passes_bound(exc):
                raise ChatTemplateError(f"the chat template fails on a small conversation: {exc}") from None
            refused = exc
    _log.warning("the chat template raised on every probe conversation (each request gets its message): %s",
                 refused)
