"""Chat completions in OpenAI's shapes, through llama.cpp's own chat layer (blocks/chat_layer.py).

    spec = ChatSpec(messages, tools=[...], reasoning_format="auto")
    plan = plan_chat(llama, spec)          # the prompt, grammar, stops and reply parser llama-server would use
    as_chat(completion, model, plan)       # content, reasoning_content, tool_calls of the finished reply
    ChatStream(model, plan).feed(chunk)    # the same, streamed as llama-server streams it

`out.choices[0].message.content`, `finish_reason`, `usage`; `out.model_dump()` is the
OpenAI JSON. Streaming yields `ChatCompletionChunk`s whose deltas join to the message.

The chat's names in one place; each lives in the module of its job: the reply's shapes (chat_output.py), the
messages' and tools' checks (chat_messages.py), the request and its plan (chat_plan.py), the templates and their
per-model cache (chat_template.py), reading a finished reply (chat_reply.py) and streaming one (chat_stream.py).
One chat call from start to end is chat_call.py's ChatCall and ChatRun.
"""

from __future__ import annotations

from .chat_messages import ROLES, check_messages, check_tools
from .chat_output import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessage,
    Choice,
    ChunkChoice,
    Delta,
    DeltaFunction,
    DeltaToolCall,
    FinishReason,
    FunctionCall,
    ToolCall,
    Usage,
)
from .chat_plan import (
    GRAMMAR_WITH_TOOLS,
    ChatPlan,
    ChatSpec,
    chat_request,
    grammar_with_tools,
    plan_chat,
    render_prompt,
    response_schema,
)
from .chat_reply import as_chat
from .chat_stream import ChatStream, as_achunks, as_chunks
from .chat_template import CHATML_TOOLS, OWN_TEMPLATES, chat_templates, is_builtin_name, template_source

__all__ = [
    "CHATML_TOOLS", "GRAMMAR_WITH_TOOLS", "OWN_TEMPLATES", "ROLES", "ChatCompletion", "ChatCompletionChunk",
    "ChatMessage", "ChatPlan", "ChatSpec", "ChatStream", "Choice", "ChunkChoice", "Delta", "DeltaFunction",
    "DeltaToolCall", "FinishReason", "FunctionCall", "ToolCall", "Usage", "as_achunks", "as_chat", "as_chunks",
    "chat_request", "chat_templates", "check_messages", "check_tools", "grammar_with_tools", "is_builtin_name",
    "plan_chat", "render_prompt", "response_schema", "template_source",
]
