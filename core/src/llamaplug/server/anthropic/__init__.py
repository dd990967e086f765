"""Anthropic's Messages API (/v1/messages, count_tokens), translated onto the chat path."""
