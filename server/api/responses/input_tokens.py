"""``POST /v1/responses/input_tokens``: how many tokens a response's prompt would be, without running it
(the ``openai`` client's ``responses.input_tokens.count``).

The body is the prompt's half of a response's (``ResponsesPrompt``: input, instructions,
previous_response_id, tools, tool_choice, text, reasoning, truncation) and the count walks a
response's own path up to its prompt: the same translation (a bad field is the same 400), the same
stored conversation before the input, the same rendering by the chat template with the offered tools,
and with ``truncation: "auto"`` the same oldest items dropped, so a response sent with these fields
reads exactly ``input_tokens`` prompt tokens. ``personality`` (a model-owned style preset) is
accepted null and refused otherwise: the served model has no presets of its own.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from server.api.generation import engine_of, served_model, translated
from server.api.responses.items import InputItem
from server.api.responses.protocol import ResponsesPrompt, ResponsesRequest
from server.api.responses.route import continued
from server.api.responses.truncation import item_images, rendered
from server.http.auth import require_api_key
from server.translate.unserved import refused_unless_null

router = APIRouter(dependencies=[Depends(require_api_key)])

NoPersonality = refused_unless_null("personality (a model-owned style preset)", "the served model has no style "
                                    "presets; say how to answer in instructions")  # fmt: skip


class InputTokensRequest(ResponsesPrompt):
    """OpenAI's ``InputTokenCountParams``."""

    model: str | None = None  # optional: this server serves one target model (or names a LoRA adapter)
    input: str | list[InputItem] | None = None
    personality: NoPersonality = None

    def response_request(self) -> ResponsesRequest:
        """The response these fields describe (nothing else set: the defaults a response would have)."""
        fields = self.model_dump(by_alias=True, exclude_unset=True, exclude={"personality"})
        if fields.get("input") is None:
            fields.pop("input", None)
        return ResponsesRequest.model_validate(fields)


@router.post("/v1/responses/input_tokens")
async def count_input_tokens(body: InputTokensRequest, request: Request) -> dict[str, Any]:
    """The prompt's tokens for a response with these fields (the stored conversation included)."""
    client = engine_of(request)
    served_model(client, body.model)
    response, params = translated(request, client, body.response_request(), max_model_len=client.max_model_len)
    earlier, _ = await continued(request, response.previous_response_id)
    input_items = response.input_items()
    images = await item_images(request, client, earlier, input_items)
    prompt_ids, _ = await rendered(client, response, params, earlier + input_items, images)
    return {"object": "response.input_tokens", "input_tokens": len(prompt_ids)}
