"""The Responses API's conversation items: what a request's ``input`` holds, how each is stored, and
how a conversation of items becomes the chat template's messages.

An item is a message (roles user, assistant, system, developer; its content a string or
``input_text``/``output_text`` parts), a ``function_call`` the model made, or the
``function_call_output`` that answers it. Items are kept in OpenAI's own output shape (each with
an ``id``), the shape ``GET /v1/responses/{id}/input_items`` lists and a continued conversation
replays, so the stored conversation and what the client sent read the same. The template gets what
``server.api.chat.messages`` gives chat's (roles, text, ``tool_calls`` with arguments as objects,
tool turns with ``tool_call_id``), so one template renders both APIs.

Every field the ``openai`` SDK's item types define is known, so its objects replay as dicts
(``ResponseFunctionToolCall.model_dump(by_alias=True)``): a message's ``type`` may be left out or
null, a replayed ``refusal`` part is the turn's text, a function's ``output`` may be ``input_text``
parts, an output without ``call_id`` answers the oldest call still unanswered; ``async``,
``created_by``, ``prompt_cache_breakpoint`` are no-ops; ``caller`` and ``namespace`` are refused when
they ask for what is not served (``server.translate.unserved``), as are item references.

A message's ``input_image`` parts (``image_url``: a data: URL, or an http(s) URL of an allowed host;
``detail`` accepted) are stored as sent, so a conversation continued with ``previous_response_id``
sends the same image again; a ``file_id`` is a 400 (there is no files API). A message with images
reaches the template with its parts in order (``{"type": "image"}`` where each image stands).
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag, model_validator

from decoding import ParameterError
from server.api.chat.messages import PromptCacheBreakpoint
from server.translate.images import ImagePart
from server.translate.strict import Strict
from server.translate.unserved import Caller, Namespace

UNSERVED_PARTS = ("input_file", "input_audio")  # parts no served model reads
IMAGE_ROLES = ("user", "system", "developer")  # OpenAI's: the roles whose messages may hold input_image


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _served_part(part: Any) -> Any:  # noqa: ANN401
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in UNSERVED_PARTS:
        raise ParameterError(f"{kind} content parts are not supported: this server reads text and images, not "
                             "files or audio (send input_text or input_image parts)")  # fmt: skip
    return part


def _text_output(part: Any) -> Any:  # noqa: ANN401
    if isinstance(part, dict) and part.get("type") == "input_image":
        raise ParameterError("images in a function's output are not supported: send the image in a user message's "
                             "input_image part")  # fmt: skip
    return _served_part(part)


def _no_file_id(value: Any) -> Any:  # noqa: ANN401
    if value is not None:
        raise ParameterError("file_id is not served: this server has no files API; send the image as image_url "
                             "(a data: URL, data:image/png;base64,...)")  # fmt: skip
    return value


class TextContent(Strict):
    """A text part: ``input_text`` in a turn the client wrote, ``output_text`` in a replayed reply."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None  # a reply's citations: not rendered
    logprobs: list[dict[str, Any]] | None = None  # a replayed reply's logprobs: not rendered
    prompt_cache_breakpoint: PromptCacheBreakpoint | None = None  # a hint: every prompt's blocks are cached


class RefusalContent(Strict):
    """A replayed reply's refusal: its text is the turn's text, as chat's refusal part."""

    type: Literal["refusal"]
    refusal: str


class ImageContent(Strict):
    """An image part (OpenAI's ``input_image``): stored as sent, see the module's docstring."""

    type: Literal["input_image"]
    image_url: str | None = None
    detail: Literal["auto", "low", "high"] | None = None  # accepted: the model's processor sets the resolution
    file_id: Annotated[None, BeforeValidator(_no_file_id)] = None

    @model_validator(mode="after")
    def _has_its_image(self) -> ImageContent:
        if self.image_url is None:
            raise ParameterError("an input_image without image_url is not served: send image_url (a data: URL, "
                                 "data:image/png;base64,...)")  # fmt: skip
        return self

    def stored(self) -> dict[str, Any]:
        return {"type": "input_image", "image_url": self.image_url, "detail": self.detail or "auto", "file_id": None}


def _part_kind(part: Any) -> str | None:  # noqa: ANN401
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    tags = {"refusal": "RefusalContent", "input_image": "ImageContent"}
    return tags.get(kind, "TextContent") if isinstance(kind, str) else None


ContentPart = Annotated[
    Annotated[TextContent, Tag("TextContent")] | Annotated[RefusalContent, Tag("RefusalContent")]
    | Annotated[ImageContent, Tag("ImageContent")],
    Discriminator(_part_kind, custom_error_type="invalid_content_part",
                  custom_error_message="a content part's type must be input_text, output_text, input_image or "
                                       "refusal"),
    BeforeValidator(_served_part),
]  # fmt: skip


def part_text(part: TextContent | RefusalContent | ImageContent) -> str:
    return part.text if isinstance(part, TextContent) else part.refusal if isinstance(part, RefusalContent) else ""


class MessageItem(Strict):
    type: Literal["message"] | None = "message"  # an EasyInputMessage may leave it out, or send it null
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    @model_validator(mode="after")
    def _images_in_their_roles(self) -> MessageItem:
        if self.role not in IMAGE_ROLES and any(isinstance(part, ImageContent) for part in self.content):
            raise ParameterError(
                f"an input_image in an {self.role} message is not supported: {', '.join(IMAGE_ROLES)} messages "
                "carry images"
            )
        return self

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part_text(part) for part in self.content)

    def stored(self) -> dict[str, Any]:
        """Its text as one part; with images, each run of text one part and each image its own, in order."""
        kind = "output_text" if self.role == "assistant" else "input_text"
        runs: list[str | ImageContent] = [""]
        for part in self.content if isinstance(self.content, list) else []:
            if isinstance(part, ImageContent):
                runs += [part, ""]
            else:
                runs[-1] += part_text(part)
        if len(runs) == 1:
            runs = [self.text()]
        parts = [run.stored() if isinstance(run, ImageContent) else
                 {"type": kind, "text": run, **({"annotations": []} if kind == "output_text" else {})}
                 for run in runs if run != "" or len(runs) == 1]  # fmt: skip
        return {"id": self.id or new_id("msg"), "type": "message", "role": self.role, "content": parts,
                "status": self.status or "completed"}  # fmt: skip


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # a JSON object, as OpenAI sends it
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    async_: bool | None = Field(default=None, alias="async")  # how a replayed call ran: nothing to render
    caller: Caller = None  # the model's own call (null or direct); a program's is not served
    namespace: Namespace = None

    def stored(self) -> dict[str, Any]:
        return {"id": self.id or new_id("fc"), "type": "function_call", "call_id": self.call_id, "name": self.name,
                "arguments": self.arguments, "status": self.status or "completed"}  # fmt: skip


class OutputText(Strict):
    """A text part of a function's output (its image and file parts are not served: text-only model)."""

    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: PromptCacheBreakpoint | None = None  # a hint, as a message part's


class FunctionCallOutputItem(Strict):
    """A function's result; without ``call_id`` it answers the oldest call still unanswered (of its
    ``name``, when given: ``template_messages``)."""

    type: Literal["function_call_output"]
    call_id: str | None = None
    output: str | list[Annotated[OutputText, BeforeValidator(_text_output)]]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    name: str | None = None  # the function that produced it
    caller: Caller = None
    namespace: Namespace = None
    created_by: str | None = None  # who stored a replayed output item: nothing to render

    def stored(self) -> dict[str, Any]:
        output = self.output if isinstance(self.output, str) else "".join(part.text for part in self.output)
        return {"id": self.id or new_id("fco"), "type": "function_call_output", "call_id": self.call_id,
                "output": output, "status": self.status or "completed",
                **({"name": self.name} if self.name is not None else {})}  # fmt: skip


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
    kind = (item.get("type") if isinstance(item, dict) else getattr(item, "type", None)) or "message"
    return ITEM_KINDS.get(kind) if isinstance(kind, str) else None


def _served_item(item: Any) -> Any:  # noqa: ANN401
    kind = (item.get("type") or "message") if isinstance(item, dict) else None
    if kind == "item_reference" or (kind == "message" and "id" in item and "role" not in item):  # type is optional
        raise ParameterError("item references are not served: send the item itself, or continue a stored "
                             "conversation with previous_response_id")  # fmt: skip
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
        return [part["text"] for part in item["content"] if part["type"] != "input_image"]
    if item["type"] == "function_call":
        return [item["name"], item["arguments"]]
    if item["type"] == "reasoning":  # a stored reply's thinking: not rendered (template_messages)
        return []
    return [item["output"]]


def template_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as chat-template messages: the instructions as the system turn, each message
    a turn, a run of function calls one assistant turn's ``tool_calls``, each output a tool turn (an
    output without ``call_id`` answers the oldest call still unanswered, of its ``name`` when given)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    ids = call_ids(items)
    for index, item in enumerate(items):
        if item["type"] == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _content(item["content"])})
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
            turn = {"role": "tool", "tool_call_id": ids[index], "content": item["output"], "name": item.get("name")}
            messages.append({key: value for key, value in turn.items() if value is not None})
    if not messages or messages[-1]["role"] == "system":
        raise ParameterError("input must hold at least one message or function_call_output", param="input")
    return messages


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, str]]:
    """A stored message's content for the template: one text, or with images its parts in order."""
    if not any(part["type"] == "input_image" for part in parts):
        return "".join(part["text"] for part in parts)
    return [{"type": "image"} if part["type"] == "input_image" else {"type": "text", "text": part["text"]}
            for part in parts]  # fmt: skip


def image_parts(items: list[dict[str, Any]], param_of: Any) -> list[tuple[int, ImagePart]]:  # noqa: ANN401
    """(the item's index, the image) of every image of stored ``items``, in the order the template meets them;
    ``param_of(index, j)``: the path of item ``index``'s part ``j``, which every error about it names."""
    return [(index, ImagePart(part["image_url"], param_of(index, j))) for index, item in enumerate(items)
            if item["type"] == "message" for j, part in enumerate(item["content"])
            if part["type"] == "input_image"]  # fmt: skip


def call_ids(items: list[dict[str, Any]]) -> list[str | None]:
    """Each item's call: a function call's own ``call_id``, the one a function's output answers (its
    ``call_id``, or without one the oldest call still unanswered, of its ``name`` when given), None
    for the rest; the template and truncation (which keeps a call with its outputs) read the same."""
    unanswered: list[tuple[str, str]] = []  # (call_id, name) of the calls no output answered yet
    ids: list[str | None] = []
    for item in items:
        call_id = item.get("call_id") if item["type"] in ("function_call", "function_call_output") else None
        if item["type"] == "function_call":
            unanswered.append((item["call_id"], item["name"]))
        elif item["type"] == "function_call_output":
            name = item.get("name")
            answered = [call for call in unanswered if call[0] == call_id] if call_id is not None else \
                [call for call in unanswered if name is None or call[1] == name][:1]  # fmt: skip
            for call in answered:
                unanswered.remove(call)
            call_id = call_id if call_id is not None else answered[0][0] if answered else None
        ids.append(call_id)
    return ids


def _arguments(text: str, index: int) -> object:
    try:
        arguments = json.loads(text)
    except json.JSONDecodeError as error:
        raise ParameterError(f"input[{index}]: a function_call's arguments must be a JSON object: {error}",
                             param="input") from error  # fmt: skip
    if not isinstance(arguments, dict):
        raise ParameterError(f"input[{index}]: a function_call's arguments must be a JSON object", param="input")
    return arguments
