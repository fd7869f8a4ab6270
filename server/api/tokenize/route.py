"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's routes and shapes): what the served tokenizer
makes of a prompt or a conversation, and back. A conversation is rendered by the same chat template
(and the same tool-capable fallback) as ``/v1/chat/completions``, so ``count`` is what that endpoint
reports as ``prompt_tokens``, its images' placeholder tokens included. Tokenizer work runs on the
engine client's tokenizer thread; a text that cannot fit the context is refused before it, and a
token id outside the vocabulary is a 400 naming ``tokens``."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from decoding import ParameterError
from server.api.generation import engine_of, images_of, served_model
from server.api.tokenize.protocol import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from server.http.auth import require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    client = engine_of(request)
    served_model(client, body.model)
    body = body.checked()
    client.check_text_size(body.texts(), "prompt" if body.prompt is not None else "messages")
    if body.prompt is not None:
        special = True if body.add_special_tokens is None else body.add_special_tokens
        ids = await client.tokenize(body.prompt, add_special_tokens=special)
    else:
        messages = body.template_messages()
        images = await images_of(request, client, body.image_parts())
        ids = await client.apply_chat_template(
            messages,
            tools=body.template_tools(),
            add_generation_prompt=body.add_generation_prompt,
            add_special_tokens=bool(body.add_special_tokens),
            **({"template_kwargs": body.chat_template_kwargs} if body.chat_template_kwargs else {}),
            **({"images": images} if images else {}),
        )
    strings = await client.token_strings(ids) if body.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=client.max_model_len, tokens=ids, token_strs=strings)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    client = engine_of(request)
    served_model(client, body.model)
    vocab_size = client.facts.vocab_size
    for i, token in enumerate(body.tokens):
        if not 0 <= token < vocab_size:
            raise ParameterError(f"tokens[{i}] is {token}, outside the vocabulary [0, {vocab_size})", param="tokens")
    return DetokenizeResponse(prompt=await client.decode(body.tokens))
