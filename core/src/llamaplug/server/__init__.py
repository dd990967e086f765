"""`llamaplug serve`: an OpenAI-compatible HTTP server over one Llama (needs `pip install "llamaplug[server]"`)."""
