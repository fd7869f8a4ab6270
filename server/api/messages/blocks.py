"""A Messages API conversation as Anthropic's SDK sends it, and what of it reaches the chat template.

The template sees chat's messages (``server.api.chat.messages`` gives the same shapes), so one template
renders both APIs: ``system`` (a string or text blocks) is the first system turn; a turn's text blocks
are its content, joined as chat joins its text parts; an assistant turn's ``tool_use`` blocks are its
``tool_calls`` (arguments as objects, as HF's templates expect); each ``tool_result`` block of a user
turn is a tool turn answering its ``tool_use_id``, in the order the blocks came. The template has no
place for ``is_error``, so such a result's text says it: ``Error: <content>``.

An assistant turn's ``thinking`` and ``redacted_thinking`` blocks (a reply sent back, as every tool loop
does) are accepted and not rendered (``server.api.messages.thinking``); in another turn they are 400s. A
user turn's ``image`` blocks (``source.type`` ``base64``, or ``url`` for a host ``--allowed-media-domains``
names) reach the template as ``{"type": "image"}`` parts among its text, in order, their files
as the request's images (``server.translate.images``, which refuses them for a model that reads no
images); a ``file`` source is a 400 (there is no files API). The server runs no server tools: document
and other media blocks and server tools' blocks are 400s naming their path (``messages[0].content[1]``),
as is a conversation that ends with an assistant turn (Anthropic's prefill: the chat template here
starts a new assistant turn, so the reply could not continue that text). ``cache_control`` marks are
hints: the prefix cache keeps every prompt's blocks without being asked. A ``tool_use`` block the SDK
replays carries ``caller`` and ``toolset_name``: accepted null (or a direct caller), refused when they
name a code-execution caller or a server toolset (``server.translate.unserved``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag

from decoding import ParameterError
from server.api.messages.thinking import RedactedThinkingBlock, ThinkingBlock
from server.translate.images import ImagePart, base64_url
from server.translate.strict import Strict
from server.translate.unserved import Caller, Toolset

SERVER_TOOL_BLOCKS = ("server_tool_use", "mcp_tool_use", "mcp_tool_result", "container_upload")
THINKING_BLOCKS = ("thinking", "redacted_thinking")


class CacheControl(Strict):
    """Anthropic's prompt-caching mark: a hint, see the module's docstring."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[dict[str, Any]] | None = None  # a replayed reply's citations: not rendered


def _served_block(block: Any) -> Any:  # noqa: ANN401
    """A block the served model cannot read is a 400 at its own path (the one place that knows it)."""
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str) or kind in ("text", "image", "tool_use", "tool_result", *THINKING_BLOCKS):
        return block
    if kind in SERVER_TOOL_BLOCKS or kind.endswith("_tool_result"):
        raise ParameterError(f"{kind} blocks belong to server tools, which this server does not run; offer a "
                             "custom tool and send its tool_use / tool_result blocks")  # fmt: skip
    raise ParameterError(f"{kind} content blocks are not supported: this server reads text and images (send text "
                         "or image blocks)")  # fmt: skip


class Base64Source(Strict):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]  # Anthropic's
    data: str


class URLSource(Strict):
    type: Literal["url"]
    url: str  # an http(s) URL of a host --allowed-media-domains names (or a data: URL)


def _image_source(source: Any) -> Any:  # noqa: ANN401
    if isinstance(source, dict) and source.get("type") == "file":
        raise ParameterError("a file source is not served: this server has no files API; send the image as a "
                             "base64 source")  # fmt: skip
    return source


class ImageBlock(Strict):
    type: Literal["image"]
    source: Annotated[Base64Source | URLSource, Field(discriminator="type"), BeforeValidator(_image_source)]
    cache_control: CacheControl | None = None

    def url(self) -> str:
        source = self.source
        return base64_url(source.media_type, source.data) if isinstance(source, Base64Source) else source.url


def _kind(**tags: str) -> Any:  # noqa: ANN401
    """The union member's tag for a block's ``type`` (a class name, which error paths leave out)."""

    def kind(block: Any) -> str | None:  # noqa: ANN401
        found = block.get("type") if isinstance(block, dict) else getattr(block, "type", None)
        return tags.get(found) if isinstance(found, str) else None

    return kind


def _result_block(block: Any) -> Any:  # noqa: ANN401
    kind = block.get("type") if isinstance(block, dict) else None
    if kind in THINKING_BLOCKS:
        raise ParameterError(f"a tool result holds text blocks, not {kind} blocks")
    if kind == "image":
        raise ParameterError("image blocks in a tool result are not supported here: send the image in a user "
                             "turn's image block")  # fmt: skip
    return _served_block(block)


ResultContent = Annotated[TextBlock, BeforeValidator(_result_block)]


class ToolUseBlock(Strict):
    """A call the assistant made (as this server's reply gave it, or another model's)."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: Caller = None  # the model's own call (null or direct); a code-execution tool's is not served
    toolset_name: Toolset = None


class ToolResultBlock(Strict):
    """What the client's tool returned for a call."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ResultContent] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None
    toolset_name: Toolset = None

    def text(self) -> str:
        text = self.content if isinstance(self.content, str) else "".join(b.text for b in self.content or [])
        return f"Error: {text}" if self.is_error else text


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("TextBlock")] | Annotated[ToolUseBlock, Tag("ToolUseBlock")]
    | Annotated[ToolResultBlock, Tag("ToolResultBlock")] | Annotated[ThinkingBlock, Tag("ThinkingBlock")]
    | Annotated[RedactedThinkingBlock, Tag("RedactedThinkingBlock")] | Annotated[ImageBlock, Tag("ImageBlock")],
    Discriminator(_kind(text="TextBlock", tool_use="ToolUseBlock", tool_result="ToolResultBlock",
                        thinking="ThinkingBlock", redacted_thinking="RedactedThinkingBlock", image="ImageBlock"),
                  custom_error_type="invalid_content_block",
                  custom_error_message="a content block's type must be 'text', 'image', 'tool_use', 'tool_result', "
                                       "'thinking' or 'redacted_thinking'"),
    BeforeValidator(_served_block),
]  # fmt: skip


class InputMessage(Strict):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]

    def blocks(self) -> list[Any]:
        """Its blocks (a string content is one text block)."""
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else list(self.content)

    def image_parts(self, param: str) -> list[ImagePart]:
        """The turn's images in order, each named by its path (``param`` is the message's)."""
        return [ImagePart(block.url(), f"{param}.content[{j}]") for j, block in enumerate(self.blocks())
                if isinstance(block, ImageBlock)]  # fmt: skip

    def rendered_texts(self) -> list[str]:
        """Everything of this turn the template writes out."""
        texts: list[str] = []
        for block in self.blocks():
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolUseBlock):
                texts += [block.id, block.name, json.dumps(block.input)]
            elif isinstance(block, ToolResultBlock):
                texts += [block.tool_use_id, block.text()]
        return texts


def system_text(system: str | list[TextBlock] | None) -> str | None:
    """``system`` as one text (its blocks joined as chat joins text parts), or None."""
    if system is None or isinstance(system, str):
        return system
    return "".join(block.text for block in system)


def template_messages(system: str | list[TextBlock] | None, messages: list[InputMessage]) -> list[dict[str, Any]]:
    """The conversation as chat templates take it (see the module's docstring)."""
    if not messages:
        raise ParameterError("messages must not be empty", param="messages")
    if messages[-1].role == "assistant":
        raise ParameterError(f"messages[{len(messages) - 1}]: the conversation ends with an assistant turn, which "
                             "the Messages API continues (prefill); this server's chat template starts a new "
                             "assistant turn instead, so end with a user turn", param="messages")  # fmt: skip
    system = system_text(system)
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system is not None else []
    for i, message in enumerate(messages):
        out.extend(_turns(message, f"messages[{i}]"))
    return out


def _turns(message: InputMessage, param: str) -> list[dict[str, Any]]:
    """One message's template turns: a user turn's tool results each a tool turn, its text (and images) a user
    turn."""
    pieces: list[dict[str, str]] = []  # the text and image parts of the turn being read, in order
    calls, turns = [], []
    for j, block in enumerate(message.blocks()):
        where = f"{param}.content[{j}]"
        if isinstance(block, ThinkingBlock | RedactedThinkingBlock):
            if message.role != "assistant":
                raise ParameterError(f"{where}: only an assistant turn carries {block.type} blocks", param=where)
            continue  # an earlier reply's thinking: not rendered (see the module's docstring)
        if isinstance(block, TextBlock):
            pieces.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            if message.role != "user":
                raise ParameterError(f"{where}: image blocks in an assistant turn are not supported: only a user "
                                     "turn carries images", param=where)  # fmt: skip
            pieces.append({"type": "image"})
        elif isinstance(block, ToolUseBlock):
            if message.role != "assistant":
                raise ParameterError(f"{where}: only an assistant turn carries tool_use blocks", param=where)
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": block.input}})  # fmt: skip
        else:
            if message.role != "user":
                raise ParameterError(f"{where}: only a user turn carries tool_result blocks", param=where)
            if content := _content(pieces):  # text before a result stays before it
                turns.append({"role": "user", "content": content})
            pieces = []
            turns.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()})
    content = _content(pieces)
    if calls:
        return [{"role": "assistant", "content": content, "tool_calls": calls}]
    if content or not turns:
        turns.append({"role": message.role, "content": content})
    return turns


def _content(pieces: list[dict[str, str]]) -> str | list[dict[str, str]]:
    """A turn's content: its text joined, or with images its parts in order (``{"type": "image"}`` where each
    image stands, where a vision-language model's template writes its image markers)."""
    if not any(piece["type"] == "image" for piece in pieces):
        return "".join(piece["text"] for piece in pieces)
    return pieces
