"""The high level: Llama and completions."""
