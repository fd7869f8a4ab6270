"""The one path every generation API takes; an API's route only adds its prompt and its formatter.

1. ``translated``: the body's sizes (every list and every text it will render, before any template or
   tokenizer: ``server.translate.sizes``), its preset, then the one translation to validated
   ``GenerationParams`` (``server.translate.params``), then the server's default watermark.
2. The route turns its body into prompt ids (a chat template, a tokenizer, ids as sent).
3. ``admitted``: the negative prompt and the prediction tokenized, the checks against the model (vocabulary, context,
   batch), the structured output compiled off the event loop.
4. ``respond``: the caller's limit grown to the request's rows, one engine request per prompt, and
   the streams handed to ``server.output.streaming`` with the API's formatter: SSE chunks or one body.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse

from decoding import EngineClient, GenerationParams, ParameterError, RequestOutput
from decoding.media import ImageInput
from decoding.params import guidance_active
from server.http.auth import caller_of
from server.http.errors import APIError, unavailable
from server.http.limits import caller_hold
from server.output.streaming import ChunkFormat, collect_all, sse_events, until_disconnect
from server.translate.fields import GenerationFields
from server.translate.guidance import with_negative_prompt_ids
from server.translate.images import ImagePart, MediaPolicy, image_inputs
from server.translate.params import length_is_given, with_context_default
from server.translate.prediction import with_prediction_ids
from server.translate.presets import presets_of
from server.translate.scheduling import scheduled
from server.translate.sizes import check_body_sizes
from server.translate.watermark import with_server_watermark

Body = TypeVar("Body", bound=GenerationFields)


def engine_of(request: Request) -> EngineClient:
    """The engine client, first thing in every engine-facing route: while the model loads or the
    server drains, a 503 with ``Retry-After`` before any tokenizer, template or compiler work, so a
    load balancer hands the request to another replica instead of it failing half-way."""
    client = getattr(request.app.state, "engine", None)
    if client is None:
        raise unavailable("the model is still loading", code="loading")
    if client.is_draining():
        raise unavailable("the server is shutting down")
    return client


def served_model(client: EngineClient, model: str | None) -> str:
    """The name responses carry; ``model`` may be omitted since one model is served (as vLLM allows), or
    name a LoRA adapter the server serves (``--lora-modules``, ``/v1/load_lora_adapter``), as vLLM's does."""
    if model is not None and model != client.model_name:
        if model in client.lora_names():
            return model
        adapters = client.lora_names()
        also = f" and the LoRA adapters {', '.join(adapters)}" if adapters else ""
        raise APIError(404, f"The model '{model}' does not exist; this server serves '{client.model_name}'{also}",
                       param="model", code="model_not_found")  # fmt: skip
    return client.model_name


def with_adapter(client: EngineClient, body: GenerationFields, params: GenerationParams) -> GenerationParams:
    """The LoRA adapter the body's ``model`` names (``served_model`` checked it exists), into the params."""
    model = getattr(body, "model", None)
    if model is None or model == client.model_name:
        return params
    if params.custom_generate is not None:
        raise ParameterError(f"custom_generate runs the base model's own generate(); it cannot run the LoRA "
                             f"adapter '{model}'", param="model", code="unsupported")  # fmt: skip
    return params.replace(lora_name=model)


def translated(request: Request, client: EngineClient, body: Body, **endpoint: Any) -> tuple[Body, GenerationParams]:
    """(the body with its preset's fields, its validated params); a bad field is a 400 before any
    template, tokenizer or compiler work. ``endpoint``: what the body's ``params`` takes besides the
    model's defaults."""
    check_body_sizes(client, body)
    body = presets_of(request).apply(body)  # request > preset > model defaults
    body = body.with_tool_format(request.app.state.settings.tool_call_parser)  # the calls the parser reads
    params = with_adapter(client, body, body.params(client.generation_defaults, **endpoint))
    params = scheduled(params, body, request.app.state.settings.scheduling_policy, caller_of(request).identity)
    return body, with_server_watermark(request, params)  # request > server default


async def templated(
    client: EngineClient, body: GenerationFields, params: GenerationParams, messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None, template_kwargs: dict[str, Any] | None = None,
    images: Sequence[ImageInput] = (),
) -> tuple[list[int], GenerationParams]:  # fmt: skip
    """(the conversation's prompt ids through the chat template, the params with chat's default length:
    what the context leaves after that prompt, OpenAI's, unless the request or the model set one).
    ``template_kwargs``: the template's variables an API sets itself (the Messages API's ``thinking``);
    ``images``: the conversation's images (``server.translate.images``), in the order of its image parts. The
    ids come back as the engine made them (a ``PromptIds`` carrying the images) and must reach ``generate``
    as they are, never copied."""
    extra = getattr(body, "chat_template_kwargs", None)  # a body that has them (chat): the template's variables
    extra = {**(extra or {}), **(template_kwargs or {})}
    options: dict[str, Any] = {"template_kwargs": extra} if extra else {}
    if images:
        options["images"] = images
    prompt_ids = await client.apply_chat_template(messages, tools=tools, **options)
    if not length_is_given(body, client.generation_defaults):
        params = with_context_default(params, client.max_model_len - len(prompt_ids))
    return prompt_ids, params


async def admitted(
    client: EngineClient, params: GenerationParams, prompts: list[list[int]], prompt_param: str
) -> GenerationParams:
    """The params the engine runs, once the prompt ids are known: checked against the model, with the
    negative prompt's ids and the compiled constraint."""
    params = await with_prediction_ids(client, await with_negative_prompt_ids(client, params))
    client.check_request(params, prompts, prompt_param)
    return await client.compile_structured_output(params)  # off the event loop; a bad schema is a 400


async def submit(
    request: Request, client: EngineClient, request_id: str, prompts: list[list[int]], params: GenerationParams
) -> list[AsyncIterator[RequestOutput]]:
    """One engine request per prompt, each timed by priority and caller (``server.http.request_latency``);
    if one is refused (queue full), the ones before it are aborted."""
    latency = request.app.state.request_latency
    streams: list[AsyncIterator[RequestOutput]] = []
    try:
        for i, ids in enumerate(prompts):
            streams.append(latency.timed(client.generate(f"{request_id}-{i}", ids, params), params))
    except Exception:
        for i in range(len(streams)):
            await client.abort(f"{request_id}-{i}")
        raise
    return streams


def engine_rows(params: GenerationParams) -> int:
    """Rows one prompt runs in the engine: its beams, else its ``n`` sequences; twice with guidance."""
    rows = params.num_beams if params.num_beams > 1 else params.n
    return rows * (2 if guidance_active(params) else 1)


def _widest_field(params: GenerationParams, num_prompts: int) -> str:
    """The field to name when a request runs too many rows."""
    if params.num_beams > 1:
        return "num_beams"
    return "n" if params.n > 1 or num_prompts == 1 else "prompt"


async def respond(
    request: Request, client: EngineClient, fmt: ChunkFormat, prompts: list[list[int]],
    params: GenerationParams, stream: bool,
) -> Response:  # fmt: skip
    hold = caller_hold(request.scope.get("state", {}))
    if hold is not None:  # the caller's limit counts the rows this request will run
        hold.grow(len(prompts) * engine_rows(params), _widest_field(params, len(prompts)))
    streams = await submit(request, client, fmt.request_id, prompts, params)
    if stream:
        return EventSourceResponse(sse_events(streams, fmt), ping=15)
    return JSONResponse(fmt.body(await until_disconnect(request, collect_all(streams))))


async def images_of(request: Request, client: EngineClient, parts: Sequence[ImagePart]) -> list[ImageInput]:
    """The conversation's image files, by the server's limits and allowed hosts (``server.translate.images``)."""
    return await image_inputs(client, parts, MediaPolicy.of(request.app.state.settings))
