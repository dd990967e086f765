"""The server's chat defaults (ChatSettings): llama-server's chat flags, which a request's own fields override."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ChatSettings:
    """A server's chat defaults, as llama-server's flags set them (--reasoning-format, -rea/--reasoning,
    --reasoning-effort, --chat-template-kwargs, --reasoning-budget, --reasoning-budget-message): a request's own
    fields win (a reasoning_budget_tokens of -1 is llama-server's "not given"), kwargs are merged."""

    reasoning_format: str | None = None
    enable_thinking: bool | None = None  # --reasoning on / off (None: auto, the template's default)
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    reasoning_budget: int = -1  # --reasoning-budget (-1: unlimited)
    reasoning_budget_message: str | None = None  # --reasoning-budget-message
    jinja: bool = True  # --no-jinja: llama.cpp's built-in templates (llama_chat_apply_template), no tools

    def options(self, chat_template: str | None = None, **given: Any) -> dict[str, Any]:
        """ChatSpec's keyword arguments: `given` (a request's fields; None means not given) over these."""
        out = {k: v for k, v in given.items() if v is not None}
        for key in ("reasoning_format", "enable_thinking", "reasoning_effort", "reasoning_budget_message"):
            if key not in out and getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if out.get("reasoning_budget_tokens", -1) == -1 and self.reasoning_budget != -1:
            out["reasoning_budget_tokens"] = self.reasoning_budget
        if self.chat_template_kwargs:
            out["chat_template_kwargs"] = {**self.chat_template_kwargs, **(out.get("chat_template_kwargs") or {})}
        if chat_template is not None:
            out["chat_template"] = chat_template
        if not self.jinja:
            out["use_jinja"] = False
        return out
