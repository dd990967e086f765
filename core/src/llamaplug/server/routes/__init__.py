"""One APIRouter per resource; app.py includes each of ROUTERS. A new endpoint family is one new module here."""

from __future__ import annotations

from . import admin, chat, completions, embeddings, messages, models, responses

ROUTERS = [admin.router, models.router, completions.router, chat.router, embeddings.router,
           messages.router,
           responses.router]
