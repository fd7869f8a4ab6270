"""The ``/v1/messages`` and ``/v1/messages/count_tokens`` bodies: Anthropic's fields over the shared ones.

The conversation (``system``, ``messages``, ``tools``, ``tool_choice``, ``thinking``) is one table,
``Conversation``, which both bodies share, so ``count_tokens`` counts exactly what a message's prompt
holds. ``MessagesRequest`` adds the generation fields every API shares (``GenerationFields``): its
translation is the shared one (``server.translate.params``), so every HF GenerationConfig knob,
preset and strategy is an extra field exactly as on chat. What Anthropic spells its own way maps
onto the shared pieces: ``max_tokens`` (required, as Anthropic's) is chat's, ``stop_sequences`` chat's
``stop`` (trimmed from the reply, as Anthropic's are), custom ``tools`` and ``tool_choice`` a
``ToolUse`` of chat's tools (``any`` is chat's ``required``, ``tool`` a named function,
``disable_parallel_tool_use`` ``parallel_tool_calls: false``), so chat's call grammar forces a call.

Refused with a 400 naming the field and saying why: server tools (a tool with another ``type`` than
``custom``: this server runs none), OpenAI's spellings of what Anthropic names otherwise (``stop``, ``user``,
``stream_options``), ``n`` above 1 (a message is one reply) and ``return_token_ids`` (a message has no
place for them). ``metadata.user_id``, ``service_tier`` and ``cache_control`` are hints: one user, one
tier and a prefix cache that keeps every prompt's blocks without being asked; so are a tool's
``eager_input_streaming`` (a call's input streams once the parser has read it whole) and
``input_examples`` (a chat template's tools have no place for them). A tool's ``defer_loading`` and
non-direct ``allowed_callers`` are refused when set (``server.translate.unserved``). The fields about
how Anthropic runs a request (``speed``, ``inference_geo``, ``user_profile_id``, ``workspace_id``:
hints; ``container`` and a ``diagnostics.previous_message_id``: refused) are
``server.api.messages.run_options``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sized
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from decoding import GenerationParams, ParameterError
from decoding.params import check_size
from decoding.params.structured import StructuredOutput
from server.api.messages.blocks import CacheControl, InputMessage, TextBlock, system_text, template_messages
from server.api.messages.run_options import RequestHints, RunOptions
from server.api.messages.thinking import ThinkingConfig, check_budget
from server.translate.fields import GenerationFields
from server.translate.images import ImagePart
from server.translate.params import to_params
from server.translate.strict import Strict
from server.translate.structured import JsonSchemaFormat, OpenAIName, ResponseFormat, structured_output_of
from server.translate.tools import FunctionDefinition, FunctionName, NamedToolChoice, Tool, ToolChoice, ToolUse
from server.translate.unserved import AllowedCallers, DeferLoading


def _custom_tools_only(tool: Any) -> Any:  # noqa: ANN401
    kind = tool.get("type") if isinstance(tool, dict) else None
    if isinstance(kind, str) and kind != "custom":
        raise ParameterError(f"tools of type '{kind}' are server tools, which this server does not run; offer a "
                             "custom tool (name, description, input_schema) and run it yourself")  # fmt: skip
    return tool


class CustomTool(Strict):
    type: Literal["custom"] | None = None
    name: OpenAIName
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None  # as chat's: the call's objects admit only the properties they name
    cache_control: CacheControl | None = None
    allowed_callers: AllowedCallers = None  # the model calls every tool itself (null or ["direct"])
    defer_loading: DeferLoading = None
    eager_input_streaming: bool | None = None  # a hint: a call's input streams once the parser has read it whole
    input_examples: list[dict[str, Any]] | None = None  # not rendered: a chat template's tools have no place for them

    def as_chat_tool(self) -> Tool:
        function = FunctionDefinition(name=self.name, description=self.description, parameters=self.input_schema,
                                      strict=self.strict)  # fmt: skip
        return Tool(type="function", function=function)


class AutoChoice(Strict):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class AnyChoice(Strict):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class NamedChoice(Strict):
    type: Literal["tool"]
    name: OpenAIName
    disable_parallel_tool_use: bool | None = None


class NoneChoice(Strict):
    type: Literal["none"]


MessagesToolChoice = Annotated[AutoChoice | AnyChoice | NamedChoice | NoneChoice, Field(discriminator="type")]


class Conversation(Strict):
    """What is rendered into the prompt, shared by a message and its token count."""

    model: str | None = None  # optional: this server serves one target model
    messages: list[InputMessage] = Field(default_factory=list)
    system: str | list[TextBlock] | None = None
    tools: list[Annotated[CustomTool, BeforeValidator(_custom_tools_only)]] | None = None
    tool_choice: MessagesToolChoice | None = None
    thinking: ThinkingConfig | None = None  # server.api.messages.thinking

    def tool_use(self) -> ToolUse | None:
        if self.tools is None and self.tool_choice is None:
            return None
        choice: ToolChoice | None = None
        parallel = True
        if isinstance(self.tool_choice, NamedChoice):
            choice = NamedToolChoice(type="function", function=FunctionName(name=self.tool_choice.name))
        elif self.tool_choice is not None:
            choice = {"auto": "auto", "any": "required", "none": "none"}[self.tool_choice.type]  # type: ignore[assignment]
        if not isinstance(self.tool_choice, NoneChoice | None):
            parallel = not self.tool_choice.disable_parallel_tool_use
        return ToolUse([tool.as_chat_tool() for tool in self.tools or []], choice, parallel)

    def template_tools(self) -> list[dict[str, Any]] | None:
        tool_use = self.tool_use()
        return tool_use.template_json() if tool_use else None

    def template_messages(self) -> list[dict[str, Any]]:
        return template_messages(self.system, self.messages)

    def image_parts(self) -> list[ImagePart]:
        """The conversation's images, in the order the template meets them."""
        return [part for i, message in enumerate(self.messages) for part in message.image_parts(f"messages[{i}]")]

    def sized_lists(self) -> dict[str, Sized | None]:
        return {"messages": self.messages, "tools": self.tools}

    def rendered_texts(self) -> dict[str, list[str]]:
        texts = [text for message in self.messages for text in message.rendered_texts()]
        system = system_text(self.system)
        tools = self.template_tools()
        return {"messages": texts + ([json.dumps(tools)] if tools else []),
                **({"system": [system]} if system is not None else {})}  # fmt: skip


class Metadata(Strict):
    user_id: Annotated[str, Field(max_length=256)] | None = None  # a hint: Anthropic's abuse checks; unused here


class JsonOutputFormat(Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Strict):
    """Anthropic's structured outputs: ``format`` takes chat's json_schema path (the grammar holds the
    reply to the schema under every strategy)."""

    format: JsonOutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # a hint: max_tokens bounds a reply


# OpenAI's fields of GenerationFields that Anthropic names otherwise (or has no use for): one spelling per API
OTHER_SPELLINGS = {
    "stop": "stop_sequences",
    "user": "metadata.user_id",
    "stream_options": "nothing: message_delta always carries the usage",
}


class MessagesRequest(Conversation, RunOptions, GenerationFields):
    max_tokens: int  # required, as Anthropic's
    stop_sequences: list[str] | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # a hint: one tier here
    cache_control: CacheControl | None = None  # a hint: the prefix cache keeps every prompt's blocks
    output_config: OutputConfig | None = None

    @model_validator(mode="after")
    def _anthropic_spellings(self) -> MessagesRequest:
        for name, instead in OTHER_SPELLINGS.items():
            if name in self.model_fields_set and getattr(self, name) is not None:
                raise ParameterError(f"the Messages API takes {instead}, not {name}", param=name)
        check_budget(self.thinking, self.max_tokens)
        if self.return_token_ids:
            raise ParameterError("a message's content has no place for token ids; return_token_ids is for "
                                 "/v1/completions and /v1/chat/completions", param="return_token_ids")  # fmt: skip
        return self

    def params(self, model_defaults: dict[str, Any] | None, max_model_len: int = 1 << 30) -> GenerationParams:
        """Validated params: ``stop_sequences`` as chat's ``stop``; one reply per message."""
        body = self.model_copy(update={"stop": self.stop_sequences})
        params = to_params(body, default_max_tokens=max_model_len, model_defaults=model_defaults)
        if params.n != 1:
            name = "num_return_sequences" if "num_return_sequences" in self.model_fields_set else "n"
            raise ParameterError(f"a message is one reply; {name} must be 1, got {params.n}", param=name)
        return params

    def structured_output(self) -> StructuredOutput | None:
        """``output_config.format`` as chat's json_schema response format (or the GenerationFields' own)."""
        wanted = self.output_config.format if self.output_config is not None else None
        if wanted is None:
            return super().structured_output()
        if self.response_format is not None:
            raise ParameterError("send output_config.format or response_format, not both", param="response_format")
        schema = JsonSchemaFormat(name="output", schema=wanted.schema_)
        found = structured_output_of(ResponseFormat(type="json_schema", json_schema=schema), self.structured_outputs)
        if found is not None and found.param == "response_format":
            return dataclasses.replace(found, param="output_config.format")
        return found

    def end_user(self) -> str | None:
        """Anthropic's ``metadata.user_id`` (this API takes no ``user``)."""
        return self.metadata.user_id if self.metadata is not None else None

    def sized_lists(self) -> dict[str, Sized | None]:
        check_size("stop", self.stop_sequences, "stop_sequences")
        return super().sized_lists()

    def rendered_texts(self) -> dict[str, list[str]]:
        return {**Conversation.rendered_texts(self), **GenerationFields.rendered_texts(self)}


class CountTokensRequest(Conversation, RequestHints):
    """``/v1/messages/count_tokens``: the conversation alone, and the hints a message takes."""

    cache_control: CacheControl | None = None  # a hint, as on a message
    output_config: OutputConfig | None = None  # checked as a message's; a format constrains the reply, not the prompt
