"""Ollama's API: /api/chat, /api/generate, /api/embed and its model routes, with its errors and NDJSON lines."""
