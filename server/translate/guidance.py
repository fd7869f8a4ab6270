"""Classifier-free guidance's text field: ``negative_prompt`` becomes ``negative_prompt_ids``.

The engine works on token ids only (as HF's ``generate(negative_prompt_ids=...)`` does); the text
is tokenized here, off the event loop, exactly as a completion prompt is (no chat template: a
chat request that wants a templated negative prompt sends ``negative_prompt_ids``).
"""

from __future__ import annotations

from decoding import EngineClient, GenerationParams, ParameterError


async def with_negative_prompt_ids(client: EngineClient, params: GenerationParams) -> GenerationParams:
    if params.negative_prompt is None:
        return params
    ids = await client.tokenize(params.negative_prompt)
    if not ids:  # the engine would otherwise fall back to the prompt's last token: never silently
        raise ParameterError("negative_prompt has no tokens once tokenized", param="negative_prompt")
    return params.replace(negative_prompt=None, negative_prompt_ids=list(ids))
