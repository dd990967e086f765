"""Can RPC run here? Always: the module needs no hardware; servers are added per model."""

from __future__ import annotations


def probe() -> dict:
    return {"ok": True, "reason": "no hardware needed (servers: LlamaParams.rpc_servers)"}
