"""A chat message as real clients send it, and what of it reaches the chat template.

Clients replay a previous reply as the next turn (the ``openai`` SDK's ``message.model_dump()``),
so every field of OpenAI's message objects is known: null ones (``refusal``, ``annotations``,
``audio``, ``function_call``, ``tool_calls``) are accepted, a refusal is the turn's text when it has
no content, and the legacy ``function_call`` / ``role: "function"`` turns are read as a tool call and
its result. A user message's ``image_url`` parts (``detail`` accepted: the model's processor sets the
resolution) reach the template as ``{"type": "image"}`` parts among its text parts, their files as the
request's images (``server.translate.images``, which refuses them for a model that reads no images); a
message without images keeps its content as one text. Audio and file content parts and a message's
``audio`` are 400s naming their path (``messages[0].content[1]``); a text part's
prompt-cache marks (OpenAI's ``prompt_cache_breakpoint``, Anthropic's ``cache_control``) are hints:
the prefix cache keeps every prompt's blocks without being asked.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Tag

from decoding import ParameterError
from server.translate.images import ImagePart
from server.translate.strict import Strict
from server.translate.tools import functions_only

TEXT_ONLY = "this server serves a text-only model"
UNSERVED_PARTS = ("input_audio", "file")  # OpenAI's parts no served model reads


class CacheControl(Strict):
    """Anthropic's prompt-caching mark, which LiteLLM-style clients leave on OpenAI bodies: a hint."""

    type: Literal["ephemeral"]
    ttl: str | None = None


class PromptCacheBreakpoint(Strict):
    """OpenAI's explicit prompt-cache breakpoint: a hint (every prompt's blocks are cached anyway)."""

    mode: Literal["explicit"]
    ttl: Literal["30m", "12h"] | None = None


class TextPart(Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None  # a hint, see the module's docstring
    prompt_cache_breakpoint: PromptCacheBreakpoint | None = None  # a hint, likewise


class RefusalPart(Strict):
    """An assistant turn's refusal, as OpenAI's assistant message may carry it among its parts."""

    type: Literal["refusal"]
    refusal: str


class ImageURL(Strict):
    url: str  # a data: URL, or an http(s) URL of a host --allowed-media-domains names
    detail: Literal["auto", "low", "high"] | None = None  # accepted: the model's processor sets the resolution


class ImageURLPart(Strict):
    type: Literal["image_url"]
    image_url: ImageURL


def _served_part(part: Any) -> Any:  # noqa: ANN401
    """An audio or file part is a 400 at its own path (the one place that knows it)."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in UNSERVED_PARTS:
        raise ParameterError(f"{kind} content parts are not supported: this server reads text and images, not audio "
                             "or files (send text or image_url parts)")  # fmt: skip
    return part


def _part_kind(part: Any) -> str | None:  # noqa: ANN401
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    tags = {"text": "TextPart", "refusal": "RefusalPart", "image_url": "ImageURLPart"}
    return tags.get(kind) if isinstance(kind, str) else None


ContentPart = Annotated[
    Annotated[TextPart, Tag("TextPart")] | Annotated[RefusalPart, Tag("RefusalPart")]
    | Annotated[ImageURLPart, Tag("ImageURLPart")],
    Discriminator(_part_kind, custom_error_type="invalid_content_part",
                  custom_error_message="a content part's type must be 'text', 'image_url' (in a user turn) or "
                                       "'refusal' (in an assistant turn)"),
    BeforeValidator(_served_part),
]  # fmt: skip


def _no_audio(value: Any) -> None:  # noqa: ANN401
    if value is not None:
        raise ParameterError(f"{TEXT_ONLY}: a message's audio is not supported (replay its transcript as content)")


class CalledFunction(Strict):
    name: str
    arguments: str  # a JSON object, as OpenAI sends it


class MessageToolCall(Strict):
    id: str
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None  # the participant's name, or the function a legacy "function" turn answers
    # an assistant turn that called tools (a custom tool's call is refused: not served)
    tool_calls: list[Annotated[MessageToolCall, BeforeValidator(functions_only)]] | None = None
    tool_call_id: str | None = None  # a tool turn: which call it answers
    refusal: str | None = None  # an assistant turn that refused: its text when it has no content
    function_call: CalledFunction | None = None  # legacy: an assistant turn that called one function
    annotations: list[dict[str, Any]] | None = None  # a reply's citations (url_citation): not rendered
    audio: Annotated[None, BeforeValidator(_no_audio)] = None  # refused unless null

    def as_template_message(self, index: int) -> dict[str, Any]:
        """The message as chat templates take it (arguments as objects, as HF's templates expect)."""
        param = f"messages[{index}]"
        self._check(param)
        role = {"developer": "system", "function": "tool"}.get(self.role, self.role)
        out: dict[str, Any] = {"role": role, "content": self._template_content()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if calls := self._calls():
            out["tool_calls"] = [
                {**({"id": call_id} if call_id is not None else {}), "type": "function",
                 "function": {"name": called.name, "arguments": _arguments(called.arguments, param)}}
                for call_id, called in calls
            ]  # fmt: skip
        return out

    def _check(self, param: str) -> None:
        """What the schema cannot say: which role carries which field."""
        if self.role == "tool" and not self.tool_call_id:
            raise ParameterError(f"{param}: a tool message needs tool_call_id", param="messages")
        if self.role == "function" and not self.name:
            raise ParameterError(f"{param}: a function message needs the function's name", param="messages")
        if (self.tool_calls or self.function_call) and self.role != "assistant":
            raise ParameterError(f"{param}: only an assistant message carries tool_calls", param="messages")
        if self.tool_calls and self.function_call:
            raise ParameterError(f"{param}: give tool_calls or the legacy function_call, not both", param="messages")
        if self.role != "assistant" and (self.refusal is not None or _has_refusal_part(self.content)):
            raise ParameterError(f"{param}: only an assistant message carries a refusal", param="messages")
        if self.role != "user" and (images := self.image_parts(param)):
            raise ParameterError(f"{images[0].param}: images in a {self.role} message are not supported: only a user "
                                 "message carries images", param=images[0].param)  # fmt: skip

    def image_parts(self, param: str) -> list[ImagePart]:
        """The message's images in order, each named by its path (``param`` is the message's)."""
        parts = self.content if isinstance(self.content, list) else []
        return [ImagePart(part.image_url.url, f"{param}.content[{j}]") for j, part in enumerate(parts)
                if isinstance(part, ImageURLPart)]  # fmt: skip

    def _template_content(self) -> str | list[dict[str, str]]:
        """One text, or with images the parts in order: each text a text part, each image ``{"type": "image"}``
        (where a vision-language model's template writes its image markers)."""
        if not isinstance(self.content, list) or not any(isinstance(p, ImageURLPart) for p in self.content):
            return self.text()
        return [{"type": "image"} if isinstance(part, ImageURLPart) else {"type": "text", "text": _part_text(part)}
                for part in self.content]  # fmt: skip

    def text(self) -> str:
        """The turn's text: its content (the text of its parts), or its refusal when it has none."""
        if isinstance(self.content, list):
            text = "".join(_part_text(part) for part in self.content)
        else:
            text = self.content or ""
        return text or self.refusal or ""

    def rendered_texts(self) -> list[str]:
        """Everything of this message the template writes out."""
        calls = [text for _, called in self._calls() for text in (called.name, called.arguments)]
        return [self.text(), *([self.name] if self.name else []), *calls]

    def _calls(self) -> list[tuple[str | None, CalledFunction]]:
        """(id, function) of every call this turn made: its tool_calls, or the legacy function_call (no id)."""
        calls: list[tuple[str | None, CalledFunction]] = [(call.id, call.function) for call in self.tool_calls or []]
        return calls + ([(None, self.function_call)] if self.function_call else [])


def _part_text(part: TextPart | RefusalPart | ImageURLPart) -> str:
    return part.text if isinstance(part, TextPart) else part.refusal if isinstance(part, RefusalPart) else ""


def _has_refusal_part(content: str | list[Any] | None) -> bool:
    return isinstance(content, list) and any(isinstance(part, RefusalPart) for part in content)


def _arguments(text: str, param: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        message = f"{param}: tool_calls arguments must be a JSON object: {error}"
        raise ParameterError(message, param="messages") from error
