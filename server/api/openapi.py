"""``/openapi.json`` as the server really behaves: ranges, the served names, every error status.

FastAPI derives the request schemas from each API's ``protocol`` module but knows nothing of what
``decoding.params.validate`` and the model add: the bounds of each knob (``decoding.params.BOUNDS``,
the same table ``validate`` enforces), token ids below the vocabulary size, ``max_tokens`` up to
the context, ``n`` and ``num_beams`` up to what the batch holds, the model names this replica
serves. It also documents a 422 the server never sends (validation errors are 400s here). This
module rewrites the generated document once the engine is up (names and limits are the loaded
model's), and caches it then.

An image part (chat's ``image_url``, the Responses API's ``input_image``, a Messages ``image`` block)
says in its description what this server takes: whether the model reads images at all, and the
limits of the settings table (``--max-image-bytes``, ``--max-image-pixels``,
``--max-images-per-request``, ``--allowed-media-domains``).

Rules that tie several fields together (``num_beams`` divisible by ``num_beam_groups``, warpers
only when sampling, a prompt that fits the context…) cannot be said in JSON Schema: they are
400s, described in each operation's text.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from decoding.params import BOUNDS, MAX_N, SIZE_LIMITS
from server.api import APIS
from server.config.media_domains import parse_media_domains
from server.translate.aliases import ALIASES

API_PREFIX = "/v1/"
IMAGE_PART_SCHEMAS = ("ImageURLPart", "ImageContent", "ImageBlock")  # chat's, the Responses API's, Messages'
ERROR_STATUSES = {
    "400": "A bad parameter, an unknown field, or fields that do not go together; `param` names the field",
    "401": "Missing or wrong API key (only when the server has keys configured)",
    "403": "The key is valid but not an admin key (--admin-api-key), which this operation needs",
    "404": "Unknown model, LoRA adapter or assistant model",
    "409": "The LoRA adapter has requests in flight; unload it once they finish",
    "413": "Request body over --max-request-bytes",
    "429": "The waiting queue is full, or this API key has --max-concurrency-per-key requests open",
    "500": "A server bug; the message names the request id",
    "503": "The model is loading, the server is draining, or the engine stopped",
}
# names with a bound of their own beyond the alias table's rows
OTHER_BOUND_NAMES = {"top_logprobs": "logprobs"}
TOKEN_ID_LISTS = ("suppress_tokens", "stop_token_ids")
CROSS_FIELD_RULES = (
    "Rules across fields are 400s naming the field: `n`/`num_return_sequences`, `max_tokens`/`max_new_tokens` "
    "and `min_tokens`/`min_new_tokens` must agree where both are given; warpers (`top_k`, `min_p`, "
    "`typical_p`, `epsilon_cutoff`, `eta_cutoff`) only with sampling; `num_beams` divisible by "
    "`num_beam_groups`, `diversity_penalty` only with groups, no sampling with groups; `n` at most "
    "`num_beams` in beam search; `penalty_alpha` needs `top_k` > 1 without sampling; `dola_layers`, "
    "`penalty_alpha`, beams and assisted decoding (`assistant_model`, `prompt_lookup_num_tokens`, "
    "`assistant_early_exit`) exclude each other; the prompt plus `max_tokens` must fit the context."
    " `guidance_scale` (other than 1) only with greedy search or sampling and `2 n` rows in the batch; "
    "`negative_prompt` or `negative_prompt_ids` (not both) only with it, and plus `max_tokens` within the context."
    " `generation_preset` names one of `GET /v1/presets`; the request's own fields win over the preset's."
)


SSE_EVENT = {  # one server-sent event: a JSON chunk (or an error object) in `data`, the last one "[DONE]"
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
}


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error shape; every error the server sends has it."""

    error: ErrorBody


class Status(BaseModel):
    status: str


def install_openapi(app: FastAPI) -> None:
    app.openapi = lambda: contract(app)  # type: ignore[method-assign]


def contract(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    engine = getattr(app.state, "engine", None)
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (ErrorResponse, ErrorBody, Status):
        schemas[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas["ErrorResponse"]["properties"]["error"] = {"$ref": "#/components/schemas/ErrorBody"}
    schemas["ErrorResponse"].pop("$defs", None)
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            _document_responses(app, path, method, operation)
    if engine is not None:
        for api in APIS:
            for body in api.generation_bodies:
                if body.__name__ in schemas:
                    _constrain_request(schemas[body.__name__], engine)
            for schema_name, field in api.required:
                if schema_name in schemas:
                    _require(schemas[schema_name], field)
        _state_image_limits(schemas, app.state.settings, engine.facts.takes_images)
    if getattr(app.state, "api_key_digests", None):
        schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for path, operations in schema["paths"].items():
            if path.startswith(API_PREFIX) or (path == "/metrics" and app.state.settings.protect_metrics):
                for operation in operations.values():
                    operation["security"] = [{"bearer": []}]
    if engine is not None:
        app.openapi_schema = schema  # names and limits are the loaded model's from here on
    return schema


def errors_by_path() -> dict[str, tuple[str, ...]]:
    """Which error statuses each operation can answer, as each API registered them."""
    return {path: statuses for api in APIS for path, statuses in api.errors.items()}


def bound_name(name: str) -> str:
    """The name ``BOUNDS`` keeps a field's range under: its alias row's API name (``max_new_tokens`` ->
    ``max_tokens``), else its own."""
    for names in ALIASES.values():
        if name in names:
            return next((n for n in names if n in BOUNDS), name)
    return OTHER_BOUND_NAMES.get(name, name)


# ---- responses ----------------------------------------------------------------------------------------
def _error(description: str, status: str) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }
    if status in ("429", "503"):
        response["headers"] = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "string"}}}
    if status == "401":
        response["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
    return response


def _document_responses(app: FastAPI, path: str, method: str, operation: dict[str, Any]) -> None:
    responses = operation.setdefault("responses", {})
    responses.pop("422", None)
    request_id = {"X-Request-Id": {"description": "the caller's id, or one made for this request",
                                   "schema": {"type": "string"}}}  # fmt: skip
    status_ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Status"}}}
    if path in ("/health", "/ready"):
        responses["200"] = {"description": "alive" if path == "/health" else "ready for requests",
                            "content": status_ref}  # fmt: skip
        responses["503"] = {"description": "the worker died" if path == "/health" else "loading, draining or dead",
                            "content": status_ref}  # fmt: skip
    elif path == "/metrics":
        responses["200"] = {"description": "Prometheus text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}}}  # fmt: skip
        if app.state.settings.protect_metrics:
            responses["401"] = _error(ERROR_STATUSES["401"], "401")
    elif path in errors_by_path():
        if path.endswith("/completions"):  # the listings (models, custom_generate) are plain JSON
            ok = responses.setdefault("200", {"description": "Successful Response"})
            ok["description"] = "The completion; with `stream: true` server-sent events ending in `data: [DONE]`"
            ok.setdefault("content", {})["text/event-stream"] = {"schema": SSE_EVENT}
            operation["description"] = (operation.get("description") or "") + CROSS_FIELD_RULES
        for status in errors_by_path()[path]:
            responses[status] = _error(ERROR_STATUSES[status], status)
    for response in responses.values():
        response.setdefault("headers", {}).update(request_id)


# ---- request ranges -------------------------------------------------------------------------------
def _branches(prop: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-null alternatives of a property (pydantic writes ``X | None`` as ``anyOf``)."""
    return [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]


def _constrain(prop: dict[str, Any], keywords: dict[str, Any], kinds: tuple[str, ...] = ("integer", "number")) -> None:
    for branch in _branches(prop):
        if branch.get("type") in kinds:
            branch.update(keywords)


def _require(model_schema: dict[str, Any], name: str) -> None:
    required = model_schema.setdefault("required", [])
    if name not in required:
        required.append(name)
    _constrain(model_schema["properties"][name], {"minItems": 1}, ("array",))


def _constrain_request(model_schema: dict[str, Any], engine: Any) -> None:
    props = model_schema["properties"]
    facts = engine.facts
    token_id = {"type": "integer", "minimum": 0, "maximum": facts.vocab_size - 1}
    for name, prop in props.items():
        bound = BOUNDS.get(bound_name(name))
        if bound is not None and name != "logit_bias":
            _constrain(prop, bound.json_schema())
    for name in ALIASES["max_new_tokens"]:
        if name in props:
            _constrain(props[name], {"maximum": facts.max_model_len})
    for name in ALIASES["num_return_sequences"]:  # every sequence is a row of the running batch
        if name in props:
            _constrain(props[name], {"maximum": min(MAX_N, facts.max_num_seqs)})
    _constrain(props["num_beams"], {"maximum": min(facts.max_num_beams, facts.max_num_seqs)})
    _constrain(props["num_beam_groups"], {"maximum": min(facts.max_num_beams, facts.max_num_seqs)})
    for branch in _branches(props["logit_bias"]):
        branch["additionalProperties"] = {"type": "number", **BOUNDS["logit_bias"].json_schema()}
        branch["propertyNames"] = {"pattern": "^[0-9]+$"}
    names = [m.name for m in engine.served_models()]
    if not engine.serves_loras():  # with LoRA adapters (loaded and unloaded at runtime) there is no fixed list
        _constrain(props["model"], {"enum": names[:1]}, ("string",))
    assistants = [m.name for m in engine.served_models() if m.role == "assistant"]
    if assistants:
        _constrain(props["assistant_model"], {"enum": assistants}, ("string",))
    for name in TOKEN_ID_LISTS:
        _constrain(props[name], {"items": token_id}, ("array",))
    _constrain(props["bad_words_ids"], {"items": {"type": "array", "items": token_id, "minItems": 1}}, ("array",))
    stop = props["stop"]
    for branch in _branches(stop):
        if branch.get("type") == "string":
            branch["minLength"] = 1
        elif branch.get("type") == "array":
            branch["items"] = {"type": "string", "minLength": 1}
    if "prompt" in props:
        for branch in _branches(props["prompt"]):
            if branch.get("type") == "string":
                branch["minLength"] = 1
            elif branch.get("type") == "array":
                items = branch.get("items", {})
                branch["minItems"] = 1
                if items.get("type") == "integer":
                    branch["items"] = token_id
                elif items.get("type") == "string":
                    items["minLength"] = 1
                elif items.get("type") == "array":
                    branch["items"] = {"type": "array", "items": token_id, "minItems": 1}
    _state_sizes(props)


def _state_image_limits(schemas: dict[str, Any], settings: Any, takes_images: bool) -> None:  # noqa: ANN401
    """Each image part's description: what the served model and this server's settings take."""
    if not takes_images:
        text = "An image: the served model reads no images, so any image part is a 400 naming it."
    else:
        hosts = ", ".join(parse_media_domains(settings.allowed_media_domains)) or "no host"
        size = f"at most {settings.max_image_bytes} bytes" if settings.max_image_bytes else "any size"
        text = (
            f"An image (PNG, JPEG, WebP or GIF; an animated one's first frame): {size} (--max-image-bytes), "
            f"at most {settings.max_image_pixels} pixels (--max-image-pixels), at most "
            f"{settings.max_images_per_request} images per request (--max-images-per-request); a data: URL, "
            f"or an http(s) URL of {hosts} (--allowed-media-domains). Anything else is a 400 naming the part."
        )
    for name in IMAGE_PART_SCHEMAS:
        if name in schemas:
            schemas[name]["description"] = text


def _state_sizes(props: dict[str, Any]) -> None:
    """Every list's ``SIZE_LIMITS`` entry, the table ``validate`` and the schemas enforce."""
    for name, limit in SIZE_LIMITS.items():
        if name not in props:
            continue
        for branch in _branches(props[name]):
            kind = branch.get("type")
            items = branch.get("items", {})
            if kind == "object":
                branch.update(limit.json_schema("object"))
            elif kind == "array" and not (name == "prompt" and items.get("type") == "integer"):  # one prompt's ids
                branch.update(limit.json_schema())
                if items.get("type") in ("string", "array") and name != "sequence_bias":  # its items are pairs
                    items.update(limit.item_schema(items["type"]))
            elif kind == "string" and name in ("stop", "stop_strings"):  # one stop sequence
                branch.update(limit.item_schema("string"))
