"""Every API this server speaks, registered in one place: its router, the errors its operations
answer (``/openapi.json``), and the generation bodies whose knobs the contract constrains.

An API is a folder (``completions/``, ``chat/``, ``watermark/``) holding its ``protocol`` (the request
body: its own fields over ``server.translate.fields``), its ``format`` (engine output to its JSON and
stream events over ``server.output.envelope``) and its ``route`` (the handler, which walks the shared
path of ``server.api.generation``); the small listings (``models``, ``presets``, ``custom_generate``)
and the probes (``health``) are one module each. Adding an API is one folder and one entry below;
no other API's module changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import APIRouter

from server.api import custom_generate, health, models, presets, version
from server.api.audio import route as audio_route
from server.api.chat import protocol as chat_protocol
from server.api.chat import route as chat_route
from server.api.completions import protocol as completions_protocol
from server.api.completions import route as completions_route
from server.api.lora import route as lora_route
from server.api.messages import protocol as messages_protocol
from server.api.messages import route as messages_route
from server.api.responses import input_tokens as responses_input_tokens
from server.api.responses import protocol as responses_protocol
from server.api.responses import route as responses_route
from server.api.tokenize import route as tokenize_route
from server.api.watermark import route as watermark_route

GENERATION_ERRORS = ("400", "401", "404", "413", "429", "500", "503")


@dataclass(frozen=True)
class Api:
    router: APIRouter
    errors: dict[str, tuple[str, ...]] = field(default_factory=dict)  # path -> error statuses it answers
    generation_bodies: tuple[type, ...] = ()  # request models whose knobs /openapi.json bounds
    required: tuple[tuple[str, str], ...] = ()  # (schema, field) required beyond what the model says
    enabled_by: str | None = None  # a setting that must be on for the routes to exist (else they are 404s)
    uploads: dict[str, tuple[str, str]] = field(default_factory=dict)  # path -> (its file's field, the setting
    # bounding that file): the body limit there grows by the file's (server.http.limits.UploadLimit)


APIS: tuple[Api, ...] = (
    Api(health.router),
    Api(version.router),
    Api(models.router, {"/v1/models": ("401", "429", "500", "503"),
                        "/v1/models/{model_id}": ("401", "404", "429", "500", "503")}),
    Api(completions_route.router, {"/v1/completions": GENERATION_ERRORS},
        (completions_protocol.CompletionRequest,)),
    Api(chat_route.router, {"/v1/chat/completions": GENERATION_ERRORS},
        (chat_protocol.ChatCompletionRequest,), (("ChatCompletionRequest", "messages"),)),
    # before the responses' own routes: a method /v1/responses/input_tokens does not take is its 405 (Allow: POST),
    # not that of /v1/responses/{response_id}
    Api(responses_input_tokens.router, {"/v1/responses/input_tokens": GENERATION_ERRORS}),
    Api(responses_route.router, {"/v1/responses": GENERATION_ERRORS,
                                 "/v1/responses/{response_id}": ("400", "401", "404", "429", "500"),
                                 "/v1/responses/{response_id}/cancel": ("400", "401", "404", "429", "500"),
                                 "/v1/responses/{response_id}/input_items": ("400", "401", "404", "429", "500")},
        (responses_protocol.ResponsesRequest,)),
    Api(messages_route.router, {}, (messages_protocol.MessagesRequest,), (("MessagesRequest", "messages"),)),
    Api(audio_route.router, dict.fromkeys(audio_route.UPLOADS, GENERATION_ERRORS), uploads=audio_route.UPLOADS),
    Api(tokenize_route.router, {"/tokenize": ("400", "401", "404", "413", "429", "500", "503"),
                                "/detokenize": ("400", "401", "404", "413", "429", "500", "503")}),
    Api(watermark_route.router, {"/v1/watermark/detect": ("400", "401", "404", "413", "429", "500", "503")}),
    # vLLM registers its runtime LoRA routes only with VLLM_ALLOW_RUNTIME_LORA_UPDATING; here --enable-lora-loading
    Api(lora_route.router, {"/v1/load_lora_adapter": ("400", "401", "403", "413", "429", "500", "503"),
                            "/v1/unload_lora_adapter": ("400", "401", "403", "404", "409", "413", "429", "500",
                                                        "503")}, enabled_by="enable_lora_loading"),
    Api(presets.router, {"/v1/presets": ("401", "429", "500")}),  # loaded at start: answers while the model loads
    Api(custom_generate.router, {"/v1/custom_generate": ("401", "429", "500", "503")}),
)  # fmt: skip
