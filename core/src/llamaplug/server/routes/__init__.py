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

# Each router speaks one API family's error dialect (dialects.py), which it was built with.
ROUTERS = [admin.router, models.router, lifecycle.router, completions.router, chat.router, embeddings.router,
           # the other two client APIs, translated onto the chat path
           messages.router, responses.router,
           # llama-server's own API
           native.router, infill.router, tokens.router, templates.router, props.router, rerank.router,
           embeddings.native_router,
           # Ollama's API (errors in its shape: {"error": "..."})
           ollama.router, ollama_models.router,
           page.router]
