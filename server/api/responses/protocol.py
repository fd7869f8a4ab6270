"""The ``/v1/responses`` body: OpenAI's Responses API fields over the generation fields every API shares.

Its translation is the shared one (``server.translate.params``), so every HF GenerationConfig knob,
preset and strategy is an extra field exactly as on chat. What the Responses API spells its own way
is mapped onto the shared pieces: ``max_output_tokens`` is a name of ``max_new_tokens``
(``server.translate.aliases``), function ``tools`` and ``tool_choice`` become a ``ToolUse`` of chat's
tools, ``text.format`` becomes chat's ``response_format`` (the same constraint path, so the
``openai`` client's ``responses.parse`` works), ``top_logprobs`` with ``include:
["message.output_text.logprobs"]`` chat's logprobs.

``tool_choice`` ``allowed_tools`` offers only the function tools it names (``allowed_subset``). A
function tool's ``output_schema`` is not rendered (templates show its ``parameters``).

Refused with a 400 naming the field and saying why: tool types other than function (this server
runs no hosted tools; custom tools' free-form input is not served) and tool choices naming them, a
function tool's ``async``, ``defer_loading`` and non-direct ``allowed_callers`` when set, a
``conversation`` (OpenAI's Conversations API; ``previous_response_id`` chains here), ``background``
with ``store: false`` (a background response is polled by id), ``n`` above 1 (a response has one
output), chat's ``response_format`` (``text.format`` is this API's spelling). ``truncation: "auto"``
drops the conversation's oldest items until it fits (``server.api.responses.truncation``);
``"disabled"``, the default, keeps a conversation that does not fit a 400. The fields about how OpenAI
runs a response (``max_tool_calls``, honoured by the call grammar; ``background_options``,
``access_programs``, ``image``; ``prompt``, ``moderation`` and ``context_management``, refused unless
null) are ``server.api.responses.run_options``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sized
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from decoding import GenerationParams, ParameterError
from decoding.params import check_size
from decoding.params.structured import StructuredOutput
from server.api.responses.items import InputItem, item_texts, stored_items
from server.api.responses.run_options import RunOptions
from server.translate.fields import GenerationFields, RequestHints
from server.translate.params import to_params
from server.translate.strict import Strict
from server.translate.structured import (
    JsonSchemaFormat,
    OpenAIName,
    ResponseFormat,
    structured_output_of,
)
from server.translate.tools import (
    CUSTOM_TOOLS,
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
    Tool,
    ToolChoice,
    ToolUse,
    allowed_subset,
)
from server.translate.unserved import AllowedCallers, DeferLoading, refused_unless_null, refused_when_true

LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _function_tools_only(tool: Any) -> Any:  # noqa: ANN401
    """A tool of another type is a 400 at its own path (``tools[1]``)."""
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind == "custom":
        raise ParameterError(CUSTOM_TOOLS)
    if isinstance(kind, str) and kind != "function":
        raise ParameterError(f"tools of type '{kind}' are not supported: this server runs no hosted tools; "
                             "offer a function tool and run it yourself")  # fmt: skip
    return tool


def _function_choices_only(choice: Any) -> Any:  # noqa: ANN401
    """A ``tool_choice`` (or an allowed tool) naming another kind of tool than a function is a 400."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "custom":
        raise ParameterError(CUSTOM_TOOLS)
    if isinstance(kind, str) and kind not in ("function", "allowed_tools"):
        raise ParameterError(f"a tool_choice of type '{kind}' is not supported: this server runs no hosted tools; "
                             "choose a function tool")  # fmt: skip
    return choice


SyncOnly = refused_when_true("an async function tool", "the model waits for each call's output, which the client "
                             "sends in the next request")  # fmt: skip


class FunctionTool(Strict):
    type: Literal["function"]
    name: OpenAIName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    output_schema: dict[str, Any] | None = None  # what the function returns: not rendered (templates show parameters)
    allowed_callers: AllowedCallers = None  # the model calls every tool itself (null or ["direct"])
    defer_loading: DeferLoading = None
    async_: SyncOnly = Field(default=None, alias="async")

    def echo(self) -> dict[str, Any]:
        """The tool as a response repeats it: OpenAI's fields, the ones it may leave out only when set."""
        optional = ("output_schema", "allowed_callers", "defer_loading", "async")
        return {k: v for k, v in self.model_dump(by_alias=True).items() if v is not None or k not in optional}

    def as_chat_tool(self) -> Tool:
        function = FunctionDefinition(name=self.name, description=self.description, parameters=self.parameters,
                                      strict=self.strict)  # fmt: skip
        return Tool(type="function", function=function)


class FunctionChoice(Strict):
    type: Literal["function"]
    name: OpenAIName


class AllowedToolsChoice(Strict):
    """``allowed_tools``: only the function tools it names are offered (``mode``: may or must call one)."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[Annotated[FunctionChoice, BeforeValidator(_function_choices_only)]]


ResponsesToolChoice = Annotated[Literal["none", "auto", "required"] | FunctionChoice | AllowedToolsChoice,
                                BeforeValidator(_function_choices_only)]  # fmt: skip


class TextFormat(Strict):
    """``text.format``: text, json_object, or json_schema with its fields beside ``type`` (chat nests them)."""

    type: Literal["text", "json_object", "json_schema"]
    name: OpenAIName | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None

    def response_format(self) -> ResponseFormat:
        if self.type != "json_schema":
            return ResponseFormat(type=self.type)
        if self.name is None:
            raise ParameterError("text.format of type json_schema needs a name", param="text.format")
        schema = JsonSchemaFormat(name=self.name, schema=self.schema_, strict=self.strict,
                                  description=self.description)  # fmt: skip
        return ResponseFormat(type="json_schema", json_schema=schema)


class TextOptions(Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint: max_output_tokens bounds a reply


def _no_earlier_reasoning(value: Any) -> Any:  # noqa: ANN401
    if value == "all_turns":
        raise ParameterError("reasoning from earlier turns is not served: the chat template drops a replayed "
                             'reasoning item (send "auto" or "current_turn")')  # fmt: skip
    return value


ReasoningContext = Annotated[
    Literal["auto", "current_turn", "all_turns"] | None, BeforeValidator(_no_earlier_reasoning)
]


class Reasoning(Strict):
    """A hint for reasoning models: the served model has no separate reasoning phase to bound."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None
    mode: str | None = None  # OpenAI's "standard" or "pro" reasoning: a hint, as effort
    # which turns' reasoning the model reads: this one's (an earlier turn's reasoning item is not rendered)
    context: ReasoningContext = None


class ConversationRef(Strict):
    id: str


# OpenAI's Conversations API (a server-kept conversation a response joins): previous_response_id chains here
NoConversation = refused_unless_null("conversation (OpenAI's Conversations API)", "continue a conversation with "
                                     "previous_response_id", kind=str | ConversationRef)  # fmt: skip


class ResponsesPrompt(Strict):
    """What a response's prompt is made of: shared by a response and its input token count
    (``/v1/responses/input_tokens``), so the count is the prompt a response with the same fields reads."""

    input: str | list[InputItem] = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: NoConversation = None
    tools: list[Annotated[FunctionTool, BeforeValidator(_function_tools_only)]] | None = None
    tool_choice: ResponsesToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: Reasoning | None = None


class ResponsesRequest(ResponsesPrompt, RunOptions, GenerationFields, RequestHints):
    store: bool | None = True  # OpenAI's default (null too): the response can be retrieved and continued
    background: bool | None = None
    max_output_tokens: int | None = None
    top_logprobs: int | None = None
    include: list[str] | None = None

    def params(self, model_defaults: dict[str, Any] | None, max_model_len: int = 1 << 30) -> GenerationParams:
        """Validated params; as chat's, the default length is what the context leaves once rendered."""
        if self.background and self.store is False:
            raise ParameterError("a background response is stored (it is polled, streamed and cancelled by id): "
                                 "background: true needs store: true", param="store")  # fmt: skip
        params = to_params(self, default_max_tokens=max_model_len, model_defaults=model_defaults,
                           logprobs=self.logprobs_count())  # fmt: skip
        if params.n != 1:
            name = "num_return_sequences" if "num_return_sequences" in self.model_fields_set else "n"
            raise ParameterError(f"a response has one output; {name} must be 1, got {params.n}", param=name)
        return params

    def logprobs_count(self) -> int | None:
        """Chat's ``top_logprobs`` count when ``include`` asks for the output's logprobs."""
        unknown = [name for name in self.include or [] if name != LOGPROBS_INCLUDE]
        if unknown:
            raise ParameterError(f"include {unknown[0]!r} is not served: this server runs no hosted tools, reads no "
                                 f"images and keeps no encrypted reasoning; include may hold {LOGPROBS_INCLUDE!r}",
                                 param="include")  # fmt: skip
        if LOGPROBS_INCLUDE not in (self.include or []):
            if self.top_logprobs is not None:
                raise ParameterError(f"top_logprobs requires include [{LOGPROBS_INCLUDE!r}]", param="top_logprobs")
            return None
        return self.top_logprobs or 0

    def tool_use(self) -> ToolUse | None:
        if self.tools is None and self.tool_choice is None:
            return None
        choice: ToolChoice | None
        tools = [tool.as_chat_tool() for tool in self.tools or []]
        if isinstance(self.tool_choice, FunctionChoice):
            choice = NamedToolChoice(type="function", function=FunctionName(name=self.tool_choice.name))
        elif isinstance(self.tool_choice, AllowedToolsChoice):
            tools = allowed_subset(tools, [allowed.name for allowed in self.tool_choice.tools])
            choice = self.tool_choice.mode
        else:
            choice = self.tool_choice
        return ToolUse(tools, choice, self.parallel_tool_calls is not False, max_calls=self.max_tool_calls)

    def template_tools(self) -> list[dict[str, Any]] | None:
        tool_use = self.tool_use()
        return tool_use.template_json() if tool_use else None

    def structured_output(self) -> StructuredOutput | None:
        if self.response_format is not None:
            raise ParameterError("the Responses API takes text.format, not response_format", param="response_format")
        text_format = self.text.format if self.text is not None else None
        found = structured_output_of(text_format.response_format() if text_format else None, self.structured_outputs)
        if found is not None and found.param == "response_format":
            return dataclasses.replace(found, param="text.format")
        return found

    def input_items(self) -> list[dict[str, Any]]:
        """This request's own items, as stored and listed (each with an id)."""
        return stored_items(self.input)

    def sized_lists(self) -> dict[str, Sized | None]:
        """The tools; ``input`` is bounded as chat's messages are, under its own name."""
        check_size("messages", self.input if isinstance(self.input, list) else None, "input")
        return {"tools": self.tools}

    def rendered_texts(self) -> dict[str, list[str]]:
        """What must fit the context in characters: the input, or with ``truncation: "auto"`` its last
        item (older ones may be dropped), with the instructions and the tools, and each older item on
        its own (``input[i]``: one no prompt can hold is refused, not tokenized and dropped)."""
        items = self.input_items()
        kept = items[-1:] if self.truncation == "auto" else items
        texts = [text for item in kept for text in item_texts(item)]
        texts += [self.instructions] if self.instructions is not None else []
        tools = self.template_tools()
        older = {f"input[{index}]": item_texts(item) for index, item in enumerate(items[:-1])} \
            if self.truncation == "auto" else {}  # fmt: skip
        return {"input": texts + ([json.dumps(tools)] if tools else []), **older, **super().rendered_texts()}

    def echo(self) -> dict[str, Any]:
        """What a response object repeats of its request."""
        choice = self.tool_choice.model_dump() if isinstance(self.tool_choice, FunctionChoice | AllowedToolsChoice) \
            else self.tool_choice  # fmt: skip
        text_format = self.text.format.model_dump(by_alias=True, exclude_none=True) if self.text and self.text.format \
            else {"type": "text"}  # fmt: skip
        return {
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": self.max_tool_calls,
            "metadata": self.metadata or {},
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "previous_response_id": self.previous_response_id,
            "store": self.store is not False,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_logprobs": self.top_logprobs,
            "tool_choice": choice or "auto",
            "tools": [tool.echo() for tool in self.tools or []],
            "text": {"format": text_format},
            "truncation": self.truncation or "disabled",
            "user": self.user,
            "background": self.background is True,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
        }
