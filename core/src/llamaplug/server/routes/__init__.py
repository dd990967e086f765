"""One APIRouter per resource; app.py includes each of ROUTERS. A new endpoint family is one new module here."""

from __future__ import annotations

from . import admin, chat, completions, embeddings, models, page

ROUTERS = [admin.router, models.router, completions.router, chat.router, embeddings.router, page.router]
