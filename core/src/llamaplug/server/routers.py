"""Every APIRouter the app includes (app.py), family by family.

Each API family is one package here: its request and reply shapes (`schemas.py`), the translation of its wire
format onto the chat path, and its route modules; what several families share is in shared.py. A route module
imports no other route module. Each router speaks one API family's error dialect (dialects.py), which it was
built with. A new endpoint family is one new package, its routers listed here.
"""

from __future__ import annotations

from . import admin, cors_proxy, page
from .anthropic import messages
from .mcp import routes as mcp
from .native import completion, infill, props, rerank, templates, tokens
from .ollama import generate as ollama_generate
from .ollama import models as ollama_models
from .openai import chat, completions, embeddings, models
from .responses import conversations
from .responses import routes as responses

ROUTERS = [admin.router, models.router, completions.router, chat.router, embeddings.router,
           # the other two client APIs, translated onto the chat path
           messages.router, responses.router, conversations.router,
           # llama-server's own API
           completion.router, infill.router, tokens.router, templates.router, props.router, rerank.router,
           embeddings.native_router,
           # Ollama's API (errors in its shape: {"error": "..."})
           ollama_generate.router, ollama_models.router,
           # llama-server's GET /tools (the MCP servers' tools, serve --mcp-config)
           mcp.router,
           # llama-server's MCP CORS proxy for browser pages (serve --ui-mcp-proxy)
           cors_proxy.router,
           page.router]
