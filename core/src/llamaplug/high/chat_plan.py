"""One chat request (ChatSpec) and what llama.cpp's chat layer makes of it (ChatPlan): the prompt, the grammar
and its triggers, the extra stops and the reply's parser, as llama-server would use them.

    spec = ChatSpec(messages, tools=[...], reasoning_format="auto")
    plan = plan_chat(llama, spec)          # checked, rendered by the model's template (chat_template.py's cache)
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from ..blocks.cancellation import checkpoint
from ..blocks.chat_layer import REASONING_FORMATS, parser_params
from ..blocks.chat_layer import parse_reply as parse_text
from ..blocks.json_schema import check_schema
from ..errors import ChatTemplateError, InvalidParameterError
from .chat_messages import check_messages, check_tools
from .chat_template import chat_templates, is_builtin_name
from .structured import as_response_format

if TYPE_CHECKING:
    from .llama import Llama

_log = logging.getLogger("llamaplug.chat")


@dataclasses.dataclass
class ChatSpec:
    """One chat request, in llama-server's terms: what the chat layer renders and how the reply is read.

    `tools` are OpenAI's tool dicts (or Python functions); `tool_choice` "auto", "none", "required" or
    {"type": "function", "function": {"name": ...}} (exactly one call of it); `parallel_tool_calls` None: the
    template's default, as llama-server's (true where it can write several calls); `json_schema` / `grammar`
    constrain the reply (`response_format` is turned into `json_schema`); `reasoning_format` "auto" (the thinking
    goes to reasoning_content), "none" (kept inline), "deepseek" or "deepseek-legacy". `reasoning_budget_tokens`
    (llama-server's field, also its `thinking_budget_tokens`): the thinking's length in tokens, then
    `reasoning_budget_message` and the template's end-of-thinking tag are forced (0: it ends at once; -1 or
    None: unlimited)."""

    messages: list[dict[str, Any]]
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: Any = None
    json_schema: Any = None
    grammar: str | None = None
    chat_template: str | None = None
    reasoning_format: str | None = None
    reasoning_effort: str | None = None
    enable_thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: Any = None
    reasoning_budget_tokens: int | None = None
    reasoning_budget_message: str | None = None
    structured_engine: str | None = None  # what constrains json_schema/response_format/grammar (structured.py)
    use_jinja: bool = True  # False: llama.cpp's built-in template of the same family, as llama-server's --no-jinja


@dataclasses.dataclass
class ChatPlan:
    """What llama.cpp's chat layer made of one request: the prompt's text, the grammar and its triggers,
    the extra stops, and the parser that turns the reply into content, reasoning and tool calls."""

    params: dict[str, Any]
    reasoning_format: str = "auto"
    response_format: Any = None

    def parser(self, stream: bool) -> dict[str, Any]:
        return parser_params(self.params, self.reasoning_format, stream)

    def read(self, text: str) -> dict[str, Any]:
        """The whole reply as {content, reasoning_content, tool_calls}; a reply the format's parser cannot
        read comes back as content, as the model wrote it (logged), never as an error."""
        try:
            return parse_text(self.parser(False), text, partial=False)
        except ChatTemplateError as exc:
            _log.warning("%s; the reply is returned as plain content", exc)
            return {"role": "assistant", "content": text, "reasoning_content": "", "tool_calls": []}


def _named_tool(tools: list[dict[str, Any]], tool_choice: dict[str, Any]) -> list[dict[str, Any]]:
    name = (tool_choice.get("function") or {}).get("name")
    chosen = [t for t in tools if t["function"]["name"] == name]
    if not chosen:
        raise InvalidParameterError(f"tool_choice names {name!r}, which is not among the tools", field="tool_choice")
    return chosen


def chat_request(spec: ChatSpec, messages: list[dict[str, Any]]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The chat layer's request for `spec` (messages already checked), and the tool names."""
    tool_choice = spec.tool_choice
    if tool_choice not in (None, "auto", "none", "required") and not isinstance(tool_choice, dict):
        raise InvalidParameterError(f'tool_choice must be "auto", "none", "required" or {{"type": "function", '
                                    f'"function": {{"name": ...}}}}, got {tool_choice!r}', field="tool_choice")
    tools = check_tools(spec.tools) if spec.tools is not None else None
    if tools is None and tool_choice not in (None, "auto", "none"):
        raise InvalidParameterError("tool_choice needs tools", field="tool_choice")
    if tools is not None and isinstance(tool_choice, dict):
        # llama-server takes tool_choice as a string only: a named function is "required" over that one tool.
        tools, tool_choice = _named_tool(tools, tool_choice), "required"
    request: dict[str, Any] = {"messages": messages, "tool_choice": tool_choice or "auto"}
    if tools is not None:
        for i, tool in enumerate(tools):  # their parameters become grammar in llama.cpp's converter
            check_schema(tool["function"].get("parameters"), f"tools[{i}].function.parameters")
        request["tools"] = tools
    schema = spec.json_schema
    if spec.response_format is not None:
        if tools is not None and tool_choice not in (None, "auto", "none"):
            raise InvalidParameterError("a forced tool call and response_format exclude each other",
                                        field="response_format")
        schema = response_schema(spec.response_format)
    if schema is not None and spec.grammar is not None:
        raise InvalidParameterError("json_schema (or response_format) and grammar exclude each other", field="grammar")
    if spec.grammar is not None:
        if not isinstance(spec.grammar, str):
            raise InvalidParameterError("grammar must be GBNF text", field="grammar")
        if grammar_with_tools(spec.grammar, tools, tool_choice):
            raise InvalidParameterError(GRAMMAR_WITH_TOOLS, field="grammar")
        request["grammar"] = spec.grammar
    if schema is not None:
        check_schema(schema)
        request["json_schema"] = schema
    if spec.reasoning_format is not None:
        if spec.reasoning_format not in REASONING_FORMATS:
            raise InvalidParameterError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, got "
                                        f"{spec.reasoning_format!r}", field="reasoning_format")
        request["reasoning_format"] = spec.reasoning_format
    for key in ("parallel_tool_calls", "enable_thinking", "add_generation_prompt"):
        value = getattr(spec, key)
        if value is not None:
            if not isinstance(value, bool):
                raise InvalidParameterError(f"{key} must be true or false, got {value!r}", field=key)
            request[key] = value
    if isinstance(spec.tool_choice, dict) and tools is not None:
        # OpenAI's named function is "call exactly one specific function", whatever parallel_tool_calls says (the
        # template's default lets a JSON call list repeat: SmolLM2 wrote the same get_time call 3 times); false
        # makes the chat layer's grammar, and call_first's rewrite of the JSON-native formats', one call.
        request["parallel_tool_calls"] = False
    if spec.reasoning_effort is not None:
        if not isinstance(spec.reasoning_effort, str):
            raise InvalidParameterError("reasoning_effort must be a string", field="reasoning_effort")
        request["reasoning_effort"] = spec.reasoning_effort
    if spec.chat_template_kwargs is not None:
        if not isinstance(spec.chat_template_kwargs, dict):
            raise InvalidParameterError("chat_template_kwargs must be an object", field="chat_template_kwargs")
        request["chat_template_kwargs"] = spec.chat_template_kwargs
    if spec.continue_final_message is not None:
        request["continue_final_message"] = spec.continue_final_message
    if not spec.use_jinja:  # llama-server's checks and words
        if tools:
            raise InvalidParameterError("tools param requires --jinja flag", field="tools")
        if tool_choice not in (None, "auto"):
            raise InvalidParameterError("tool_choice param requires --jinja flag", field="tool_choice")
    if not spec.use_jinja or is_builtin_name(spec.chat_template):
        request["use_jinja"] = False
    names = tuple(t["function"]["name"] for t in tools or ())
    return request, names


GRAMMAR_WITH_TOOLS = "Cannot use custom grammar constraints with tools."  # llama-server's words


def grammar_with_tools(grammar: Any, tools: Any, tool_choice: Any) -> bool:
    """Whether a custom grammar comes with tools the model may call, which llama-server refuses (one grammar
    constrains a reply: the calls' or the caller's)."""
    return bool(grammar) and bool(tools) and tool_choice != "none"


def response_schema(response_format: Any) -> Any:
    """The JSON schema an OpenAI-shaped response_format (or a pydantic model) asks for (None: free text)."""
    response_format = as_response_format(response_format)
    if not isinstance(response_format, dict) or "type" not in response_format:
        raise InvalidParameterError('response_format must be a dict with a "type"', field="response_format")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return response_format.get("schema", {"type": "object"})
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise InvalidParameterError('response_format json_schema needs {"json_schema": {"schema": {...}}}',
                                        field="response_format.json_schema")
        return spec["schema"]
    raise InvalidParameterError(f"response_format type {kind!r} is not text, json_object or json_schema",
                                field="response_format.type")


def plan_chat(llama: Llama, spec: ChatSpec, messages: list[dict[str, Any]] | None = None,
              refuse_unseen_tools: bool = True) -> ChatPlan:
    """Render `spec` with llama.cpp's chat layer (messages: the checked, flattened ones, when not spec's).

    `refuse_unseen_tools=False`: tools the template has no place for are rendered as llama-server renders them
    (left out), for a prompt that is only shown (/apply-template); a reply to generate refuses them, since the
    model would answer without seeing its tools."""
    request, names = chat_request(spec, messages if messages is not None else check_messages(spec.messages))
    templates = chat_templates(llama.model, spec.chat_template)
    checkpoint()
    params = templates.apply(request)
    checkpoint()
    if refuse_unseen_tools and names and request["tool_choice"] != "none" \
            and not templates.info["caps"].get("supports_tool_calls") \
            and params["prompt"] == templates.apply(_without_tools(request))["prompt"]:
        # A template that can neither describe tools nor write a call: llama.cpp's chat layer (so llama-server)
        # would go on without them. (One that writes calls but leaves describing the tools to the system message,
        # as DeepSeek V3.1's, is rendered as llama-server renders it.) Its prompt is the same without them: a
        # tool's name found in the prompt would not say so (a short one is there by chance).
        raise InvalidParameterError(
            "this chat template has no place for tools (the prompt it renders is the same without them), so the model "
            "would not see them; give a template that does: chatml-tools for a ChatML model "
            "(chat_template=\"chatml-tools\", llama_cpp.Llama's chat_format=\"chatml-tools\", "
            "--chat-template chatml-tools), a model maker's own, or tool_choice=\"none\"", field="tools")
    if refuse_unseen_tools and names and request["tool_choice"] == "required" and not params.get("grammar"):
        # The template shows the tools but renders no call (Granite 3.3's asks for "<|tool_call|>" in prose):
        # llama.cpp's chat layer found no call format in it, so it has no grammar to force one and no parser to
        # read one; the reply would be text with no call whatever the model wrote.
        raise InvalidParameterError(
            "this chat template shows the tools but has no tool-call format llama.cpp's chat layer can write or read "
            "(it renders no call), so a call cannot be forced: give a template that renders calls, or "
            "tool_choice=\"auto\"", field="tool_choice")
    return ChatPlan(params, spec.reasoning_format or params.get("reasoning_format", "auto"), spec.response_format)


def _without_tools(request: dict[str, Any]) -> dict[str, Any]:
    bare = {k: v for k, v in request.items() if k not in ("tools", "parallel_tool_calls")}
    bare["tool_choice"] = "auto"
    return bare


def render_prompt(llama: Llama, messages: list[dict[str, Any]], chat_template: str | None,
                  tools: list[dict[str, Any]] | None) -> tuple[str, ChatPlan]:
    """The prompt text of `messages` (what /apply-template answers), rendered by llama.cpp's chat layer."""
    plan = plan_chat(llama, ChatSpec(messages, tools=tools, chat_template=chat_template), check_messages(messages),
                     refuse_unseen_tools=False)
    return plan.params["prompt"], plan
