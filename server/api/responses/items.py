"""The Responses API's conversation items: what a request's ``input`` holds, how each is stored, and
how a conversation of items becomes the chat template's messages.

An item is a message (roles user, assistant, system, developer; its content a string or
``input_text``/``output_text`` parts), a ``function_call`` the model made, or the
``function_call_output`` that answers it. Items are kept in OpenAI's own output shape (each with
an ``id``), the shape ``GET /v1/responses/{id}/input_items`` lists and a continued conversation
replays, so the stored conversation and what the client sent read the same. The template gets what
``server.api.chat.messages`` gives chat's (roles, text, ``tool_calls`` with arguments as objects,
tool turns with ``tool_call_id``), so one template renders both APIs.
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag

from decoding import ParameterError
from server.api.chat.messages import TEXT_ONLY
from server.translate.strict import Strict

UNSERVED_PARTS = ("input_image", "input_file", "input_audio")  # parts a text-only model cannot read


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _served_part(part: Any) -> Any:  # noqa: ANN401
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in UNSERVED_PARTS:
        raise ParameterError(f"{TEXT_ONLY}: {kind} content parts are not supported (send input_text parts)")
    return part


class TextContent(Strict):
    """A text part: ``input_text`` in a turn the client wrote, ``output_text`` in a replayed reply."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None  # a reply's citations: not rendered
    logprobs: list[dict[str, Any]] | None = None  # a replayed reply's logprobs: not rendered


class MessageItem(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Annotated[TextContent, BeforeValidator(_served_part)]]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)

    def stored(self) -> dict[str, Any]:
        kind = "output_text" if self.role == "assistant" else "input_text"
        parts = [{"type": kind, "text": self.text(), **({"annotations": []} if kind == "output_text" else {})}]
        return {"id": self.id or new_id("msg"), "type": "message", "role": self.role, "content": parts,
                "status": self.status or "completed"}  # fmt: skip


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # a JSON object, as OpenAI sends it
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def stored(self) -> dict[str, Any]:
        return {"id": self.id or new_id("fc"), "type": "function_call", "call_id": self.call_id, "name": self.name,
                "arguments": self.arguments, "status": self.status or "completed"}  # fmt: skip


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def stored(self) -> dict[str, Any]:
        return {"id": self.id or new_id("fco"), "type": "function_call_output", "call_id": self.call_id,
                "output": self.output, "status": self.status or "completed"}  # fmt: skip


class ReasoningItem(Strict):
    """A reasoning item as a client replays it (the agents SDK sends the history back): kept, listed,
    and not rendered, as reasoning models' templates drop an earlier turn's thinking."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None  # a hint: nothing here is encrypted
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def stored(self) -> dict[str, Any]:
        return {"id": self.id or new_id("rs"), "type": "reasoning", "summary": self.summary,
                "content": self.content or [], "status": self.status or "completed"}  # fmt: skip


ITEM_KINDS = {"message": "MessageItem", "function_call": "FunctionCallItem",
              "function_call_output": "FunctionCallOutputItem", "reasoning": "ReasoningItem"}  # fmt: skip


def _item_kind(item: Any) -> str | None:  # noqa: ANN401
    """An item's model by its ``type``; a message may leave it out (an EasyInputMessage)."""
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)
    return ITEM_KINDS.get(kind) if isinstance(kind, str) else None


def _served_item(item: Any) -> Any:  # noqa: ANN401
    kind = item.get("type", "message") if isinstance(item, dict) else None
    if isinstance(kind, str) and kind not in ITEM_KINDS:
        raise ParameterError(f"input items of type '{kind}' are not supported here; send message, function_call, "
                             "function_call_output or reasoning items")  # fmt: skip
    return item


InputItem = Annotated[
    Annotated[MessageItem, Tag("MessageItem")] | Annotated[FunctionCallItem, Tag("FunctionCallItem")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutputItem")] | Annotated[ReasoningItem, Tag("ReasoningItem")],
    Discriminator(_item_kind, custom_error_type="invalid_input_item",
                  custom_error_message="an input item's type must be message, function_call, function_call_output "
                                       "or reasoning"),
    BeforeValidator(_served_item),
]  # fmt: skip


AnyItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


def stored_items(input_: str | list[AnyItem]) -> list[dict]:
    """The request's ``input`` as stored items, each with an id (a string is one user message)."""
    if isinstance(input_, str):
        return [MessageItem(role="user", content=input_).stored()]
    return [item.stored() for item in input_]


def item_texts(item: dict[str, Any]) -> list[str]:
    """Every text of a stored item the template writes out (for the one size check)."""
    if item["type"] == "message":
        return [part["text"] for part in item["content"]]
    if item["type"] == "function_call":
        return [item["name"], item["arguments"]]
    if item["type"] == "reasoning":  # a stored reply's thinking: not rendered (template_messages)
        return []
    return [item["output"]]


def template_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as chat-template messages: the instructions as the system turn, each message
    a turn, a run of function calls one assistant turn's ``tool_calls``, each output a tool turn."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for index, item in enumerate(items):
        if item["type"] == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": "".join(part["text"] for part in item["content"])})
        elif item["type"] == "reasoning":  # an earlier turn's thinking, dropped as reasoning models' templates do
            continue
        elif item["type"] == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": _arguments(item["arguments"], index)}}  # fmt: skip
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    if not messages or messages[-1]["role"] == "system":
        raise ParameterError("input must hold at least one message or function_call_output", param="input")
    return messages


def _arguments(text: str, index: int) -> object:
    try:
        arguments = json.loads(text)
    except json.JSONDecodeError as error:
        raise ParameterError(f"input[{index}]: a function_call's arguments must be a JSON object: {error}",
                             param="input") from error  # fmt: skip
    if not isinstance(arguments, dict):
        raise ParameterError(f"input[{index}]: a function_call's arguments must be a JSON object", param="input")
    return arguments
