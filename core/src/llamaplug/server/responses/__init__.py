"""OpenAI's Responses API (/v1/responses, stored and chained responses), translated onto the chat path."""
