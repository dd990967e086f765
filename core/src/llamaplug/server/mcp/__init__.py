"""MCP servers' tools on `llamaplug serve --mcp-config FILE`: listed at GET /tools, run for chat requests that ask."""
