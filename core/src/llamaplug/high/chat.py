"""Chat completions in OpenAI's shapes, through llama.cpp's own chat layer (blocks/chat_layer.py).

    spec = ChatSpec(messages, tools=[...], reasoning_format="auto")
    plan = plan_chat(llama, spec)          # the prompt, grammar, stops and reply parser llama-server would use
    as_chat(completion, model, plan)       # content, reasoning_content, tool_calls of the finished reply
    ChatStream(model, plan).feed(chunk)    # the same, streamed as llama-server streams it

`out.choices[0].message.content`, `finish_reason`, `usage`; `out.model_dump()` is the
OpenAI JSON. Streaming yields `ChatCompletionChunk`s whose deltas join to the message.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from .. import plugins
from ..blocks.cancellation import checkpoint
from ..blocks.chat_builtin import builtin_names
from ..blocks.chat_layer import REASONING_FORMATS, ChatReplyParser, ChatTemplates, parser_params
from ..blocks.chat_layer import parse_reply as parse_text
from ..blocks.json_schema import check_schema
from ..errors import ChatTemplateError, InvalidParameterError
from .completion import Completion, CompletionChunk, StopReason
from .structured import as_response_format, model_class, parse_reply
from .tool_calls import FunctionCall, ToolCall, check_tools

if TYPE_CHECKING:
    from ..blocks.model import LlamaModel
    from .llama import Llama

_log = logging.getLogger("llamaplug.chat")

ROLES = ("system", "developer", "user", "assistant", "tool")
FinishReason = Literal["stop", "length", "tool_calls"]


class ChatMessage(BaseModel):
    role: str
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    # The reply as the pydantic model given as response_format (Python only: not in the JSON).
    parsed: Any = Field(None, exclude=True)


class Choice(BaseModel):
    index: int
    message: ChatMessage
    finish_reason: FinishReason
    logprobs: dict[str, Any] | None = None  # {"content": [...]}: the server's, when a request asks for them


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A piece of a streamed call (OpenAI's shape): id, type and name with its first piece, then arguments."""
    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunction | None = None


class Delta(BaseModel):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: dict[str, Any] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None  # stream_options {"include_usage": true}: the last chunk's, with no choices


def _finish(reason: StopReason | None) -> FinishReason:
    return "stop" if reason in (StopReason.EOS, StopReason.STOP_SEQUENCE, StopReason.CANCELLED) else "length"


def _media_needs() -> str:
    found = plugins.providers("llamaplug_open_projector")
    if not found:
        return "the multimodal plugin (pip install llamaplug-mtmd) and LlamaParams(mmproj_path=...)"
    return f"a projector: LlamaParams(mmproj_path=...) ({', '.join(found)} is installed)"


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as plain dicts, each checked: a role we know, text content (a string or text parts).

    Content is passed on as given (text parts stay parts), so llama.cpp's chat layer renders it as
    llama-server does; an assistant message may carry tool_calls instead of content."""
    if not isinstance(messages, list) or not messages:
        raise InvalidParameterError("messages must be a non-empty list", field="messages")
    out = []
    for i, m in enumerate(messages):
        if not i % 1024:
            checkpoint()  # a request whose client left stops here (a server's worker thread)
        if isinstance(m, BaseModel):
            m = m.model_dump(exclude_none=True)
        if not isinstance(m, dict):
            raise InvalidParameterError(f"messages[{i}] must be a dict with role and content", field=f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise InvalidParameterError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                                        field=f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in ("image_url", "input_audio"):
                    raise InvalidParameterError(f"messages[{i}].content[{j}]: {kind} needs {_media_needs()}",
                                                field=f"messages[{i}].content[{j}]")
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise InvalidParameterError(f"messages[{i}].content[{j}] must be a text part",
                                                field=f"messages[{i}].content[{j}]")
        elif content is None and role == "assistant" and m.get("tool_calls"):
            pass
        elif not isinstance(content, str):
            raise InvalidParameterError(f"messages[{i}].content must be text", field=f"messages[{i}].content")
        out.append(m)
    return out


@dataclasses.dataclass
class ChatSpec:
    """One chat request, in llama-server's terms: what the chat layer renders and how the reply is read.

    `tools` are OpenAI's tool dicts (or Python functions); `tool_choice` "auto", "none", "required" or
    {"type": "function", "function": {"name": ...}}; `json_schema` / `grammar` constrain the reply
    (`response_format` is turned into `json_schema`); `reasoning_format` "auto" (the thinking goes to
    reasoning_content), "none" (kept inline), "deepseek" or "deepseek-legacy". `reasoning_budget_tokens`
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
        return out


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


# llamaplug's own name for a template: ChatML with tools in the Hermes format (<tool_call>...</tool_call>), for
# ChatML models whose own template has no place for tools (SmolLM2's): chat_template="chatml-tools".
CHATML_TOOLS = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content }}
    {%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
    {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' ~
        'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' ~
        'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, ' ~
        '\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first)
          or (message.role == 'assistant' and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
        {%- for call in message.tool_calls %}
            {%- if call.function is defined %}{%- set call = call.function %}{%- endif %}
            {{- '\\n<tool_call>\\n{\\"name\\": \\"' + call.name + '\\", \\"arguments\\": ' }}
            {{- call.arguments | tojson }}{{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""
OWN_TEMPLATES = {"chatml-tools": CHATML_TOOLS}


_templates: weakref.WeakKeyDictionary[Any, dict[str | None, ChatTemplates]] = weakref.WeakKeyDictionary()
_templates_lock = threading.Lock()


def chat_templates(model: LlamaModel, override: str | None = None) -> ChatTemplates:
    """llama.cpp's templates of `model` (or `override`: Jinja text or a built-in name), made once per model."""
    _check_override(override)
    override = OWN_TEMPLATES.get(override, override) if override is not None else None
    with _templates_lock:
        per_model = _templates.setdefault(model, {})
        found = per_model.get(override)
        if found is None or found.closed:
            found = per_model[override] = ChatTemplates(model, override)
        return found


def _check_override(override: Any) -> None:
    if override is not None and (not isinstance(override, str) or not override.strip()):
        raise InvalidParameterError("chat_template must be a Jinja template or a built-in name", field="chat_template")


def is_builtin_name(override: str | None) -> bool:
    """Whether `override` names one of llama.cpp's built-in templates other than chatml (which has a Jinja source);
    a name that is none of them (not Jinja either) raises, naming the known ones."""
    _check_override(override)
    if override is None or "{{" in override or "{%" in override or override in OWN_TEMPLATES:
        return False
    if override not in builtin_names():
        raise InvalidParameterError(f"no built-in chat template {override!r}; llama.cpp has "
                                    f"{', '.join(builtin_names())}, llamaplug {', '.join(OWN_TEMPLATES)} (or give a "
                                    "Jinja template)", field="chat_template")
    return override != "chatml"  # chatml has a Jinja source in the chat layer


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
    if is_builtin_name(spec.chat_template):
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


def plan_chat(llama: Llama, spec: ChatSpec, messages: list[dict[str, Any]] | None = None) -> ChatPlan:
    """Render `spec` with llama.cpp's chat layer (messages: the checked, flattened ones, when not spec's)."""
    request, names = chat_request(spec, messages if messages is not None else check_messages(spec.messages))
    templates = chat_templates(llama.model, spec.chat_template)
    checkpoint()
    params = templates.apply(request)
    checkpoint()
    if names and request["tool_choice"] != "none" and not templates.info["caps"].get("supports_tool_calls") \
            and params["prompt"] == templates.apply(_without_tools(request))["prompt"]:
        # A template that can neither describe tools nor write a call: llama.cpp's chat layer (so llama-server)
        # would go on without them. (One that writes calls but leaves describing the tools to the system message,
        # as DeepSeek V3.1's, is rendered as llama-server renders it.) Its prompt is the same without them: a
        # tool's name found in the prompt would not say so (a short one is there by chance).
        raise InvalidParameterError(
            "this chat template has no place for tools (the prompt it renders is the same without them), so the model "
            "would not see them; give a template that does: chat_template=\"chatml-tools\" for a ChatML model "
            "(--chat-template chatml-tools), a model maker's own, or tool_choice=\"none\"", field="tools")
    return ChatPlan(params, spec.reasoning_format or params.get("reasoning_format", "auto"), spec.response_format)


def _without_tools(request: dict[str, Any]) -> dict[str, Any]:
    bare = {k: v for k, v in request.items() if k not in ("tools", "parallel_tool_calls")}
    bare["tool_choice"] = "auto"
    return bare


def as_chat(completion: Completion, model: str, plan: ChatPlan | None = None,
            response_format: Any = None) -> ChatCompletion:
    """The ChatCompletion of a finished reply; with a pydantic model as `response_format`, message.parsed is one."""
    if plan is None:
        content, reasoning, calls = completion.text, None, []
    else:
        msg = plan.read(completion.text)
        content = msg["content"] or None if msg["tool_calls"] else msg["content"]
        reasoning = msg["reasoning_content"] or None
        calls = [_tool_call(c) for c in msg["tool_calls"]]
        response_format = response_format if response_format is not None else plan.response_format
    n_prompt, n_out = completion.timings.prompt_tokens, len(completion.tokens)  # media positions included
    finish: FinishReason = "tool_calls" if calls else _finish(completion.stop_reason)
    cls = model_class(response_format)
    parsed = parse_reply(cls, content, finish) if cls is not None and not calls else None
    message = ChatMessage(role="assistant", content=content, reasoning_content=reasoning, tool_calls=calls or None,
                          parsed=parsed)
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex[:24]}", created=int(time.time()), model=model,
        choices=[Choice(index=0, message=message, finish_reason=finish)],
        usage=Usage(prompt_tokens=n_prompt, completion_tokens=n_out, total_tokens=n_prompt + n_out))


def _tool_call(call: dict[str, Any]) -> ToolCall:
    return ToolCall(id=call["id"] or f"call_{uuid.uuid4().hex[:24]}",
                    function=FunctionCall(name=call["name"], arguments=call["arguments"]))


def as_chunks(chunks: Iterator[CompletionChunk], model: str, plan: ChatPlan | None = None
              ) -> Iterator[ChatCompletionChunk]:
    """OpenAI's stream of a completion's chunks (see ChatStream)."""
    stream = ChatStream(model, plan)
    yield stream.first()
    for piece in chunks:
        yield from stream.feed(piece)


class ChatStream:
    """Completion chunks in, OpenAI chat chunks out: the same for threads and asyncio.

    Each piece of text goes through llama.cpp's parser of the template's format, as llama-server
    streams it: reasoning in delta.reasoning_content, the answer in delta.content, and each tool
    call as its name (with id and index) and then its arguments piece by piece.
    """

    def __init__(self, model: str, plan: ChatPlan | None = None):
        self.ident, self.created, self.model = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), model
        self.plan = plan
        self._parser = ChatReplyParser(plan.parser(True)) if plan is not None else None
        self.calls = 0  # tool calls begun so far

    def chunk(self, delta: Delta, finish: FinishReason | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.ident, created=self.created, model=self.model,
                                   choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish)])

    def first(self) -> ChatCompletionChunk:
        return self.chunk(Delta(role="assistant", content=""))

    def feed(self, piece: CompletionChunk) -> list[ChatCompletionChunk]:
        final = piece.stop_reason is not None
        if self._parser is None:
            out = [self.chunk(Delta(content=piece.text))] if piece.text else []
        else:
            if not piece.text and not final:
                return []
            diffs = self._parser.update(piece.text, partial=not final)
            out = [self.chunk(delta) for delta in map(self._delta, diffs) if delta is not None]
        if final:
            finish = "tool_calls" if self.calls else _finish(piece.stop_reason)
            out.append(self.chunk(Delta(), finish))
        return out

    def _delta(self, diff: dict[str, Any]) -> Delta | None:
        delta = Delta(reasoning_content=diff["reasoning_content"] or None, content=diff["content"] or None)
        if diff["index"] >= 0:
            call = DeltaToolCall(index=diff["index"])
            if diff["id"]:
                call.id, call.type = diff["id"], "function"
                self.calls = max(self.calls, diff["index"] + 1)
            if diff["name"] or diff["arguments"]:
                call.function = DeltaFunction(name=diff["name"] or None, arguments=diff["arguments"] or None)
            delta.tool_calls = [call]
        if delta.content is None and delta.reasoning_content is None and delta.tool_calls is None:
            return None
        return delta


def render_prompt(llama: Llama, messages: list[dict[str, Any]], chat_template: str | None,
                  tools: list[dict[str, Any]] | None) -> tuple[str, ChatPlan]:
    """The prompt text of `messages` (what /apply-template answers), rendered by llama.cpp's chat layer."""
    plan = plan_chat(llama, ChatSpec(messages, tools=tools, chat_template=chat_template), check_messages(messages))
    return plan.params["prompt"], plan
