"""OpenAI's API: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models (and llama-server's model
load/unload beside them). Its shapes (schemas.py) are the chat path's own wire model."""
