"""One APIRouter per resource; app.py includes each of ROUTERS. A new endpoint family is one new module here."""

from __future__ import annotations

from . import (
               admin,
               chat,
               completions,
               embeddings,
               infill,
               lifecycle,
               messages,
               models,
               native,
               ollama,
               ollama_models,
               page,
               props,
               rerank,
               responses,
               templates,
               tokens,
)

ROUTERS = [admin.router, models.router, lifecycle.router, completions.router, chat.router, embeddings.router,
           # the other two client APIs, translated onto the chat path (each in its own error shape)
           messages.router, responses.router,
           # llama-server's own API (errors in its shape: errors.NATIVE_PATHS)
           native.router, infill.router, tokens.router, templates.router, props.router, rerank.router,
           # Ollama's API (errors in its shape: {"error": "..."})
           ollama.router, ollama_models.router,
           page.router]
