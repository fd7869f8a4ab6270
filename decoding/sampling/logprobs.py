"""Log-probabilities reported to the user, from the RAW model logits.

Like vLLM's default (``logprobs_mode="raw_logprobs"``), the numbers describe the model's own
distribution before penalties, temperature or truncation, so they stay comparable across
requests with different knobs. Computed only for rows that asked for them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from decoding.outputs import TokenLogprob, TopLogprob

TokenText = Callable[[int], str]


def token_logprob(logits: torch.Tensor, token_id: int, num_top: int, token_text: TokenText) -> TokenLogprob:
    """``logits``: ``[vocab_size]`` raw logits of the step that produced ``token_id``."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [vocab_size]
    top: list[TopLogprob] = []
    if num_top > 0:
        values, indices = torch.topk(logprobs, num_top)
        top = [
            TopLogprob(int(i), token_text(int(i)), float(v))
            for v, i in zip(values.tolist(), indices.tolist(), strict=True)
        ]
    return TokenLogprob(token_id, token_text(token_id), float(logprobs[token_id]), top)


def prompt_logprob_entries(
    logits: torch.Tensor, targets: list[int], num_top: int, token_text: TokenText
) -> list[TokenLogprob]:
    """``logits``: ``[len(targets), vocab_size]``; row i is the prediction of ``targets[i]``."""
    return [token_logprob(logits[i], token, num_top, token_text) for i, token in enumerate(targets)]
