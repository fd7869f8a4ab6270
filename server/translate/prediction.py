"""OpenAI's Predicted Outputs (``prediction``): the text a reply is expected to repeat, as token ids.

The engine works on ids only; the text is tokenized here, off the event loop, without special
tokens. Prompt lookup decoding (``decoding/engine/drafting.py``) then searches these ids before
the row's own tokens for the n-gram the reply just wrote and proposes what followed it there; the
target model verifies every draft, so the reply is the one it would be without a prediction (greedy
exactly, sampling in distribution), only faster where the prediction is right. OpenAI's usage
fields ``accepted_prediction_tokens`` / ``rejected_prediction_tokens`` report how it went.
"""

from __future__ import annotations

from decoding import EngineClient, GenerationParams


async def with_prediction_ids(client: EngineClient, params: GenerationParams) -> GenerationParams:
    if params.prediction is None:
        return params
    ids = await client.tokenize(params.prediction, add_special_tokens=False)
    return params.replace(prediction=None, prediction_ids=list(ids))
