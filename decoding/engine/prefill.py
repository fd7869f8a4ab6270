"""The prompt, fed in chunks the same way for every strategy, then handed to the strategy once.

A request's prompt is written into its strategy's prefill slot (after the blocks the prefix cache
already held for it, ``Scheduler._start``) over as many steps as the token
budget needs (chunked prefill); logits are asked for only at the last prompt position, or at
every position when the user wants prompt logprobs (``echo`` with ``logprobs``). When the last
chunk is in, the strategy's ``start`` gets the logits that predict the first generated token.
"""

from __future__ import annotations

import torch

from decoding.model.runner import RowInput
from decoding.outputs import TokenLogprob
from decoding.sampling.logprobs import TokenText, prompt_logprob_entries
from decoding.state.request import Request
from decoding.strategies import DecodingStrategy, Pick


def next_chunk(strategy: DecodingStrategy, budget: int, before_images: bool = False) -> RowInput:
    """The next at most ``budget`` prompt tokens of the strategy's request, as a row of this step;
    ``before_images``: stopping before the first image token whose features the vision tower has not
    computed yet (possibly no token at all), so the step runs no tower call."""
    request = strategy.request
    start = request.num_prefilled
    end = start + budget
    image_prompt = request.image_prompt
    if image_prompt is not None:  # a chunk never cuts an image whose tokens attend both ways
        end = image_prompt.span_end(end)
        if before_images and image_prompt.features is None:
            later = image_prompt.positions[image_prompt.positions >= start]
            end = min(end, int(later[0])) if later.numel() else end
    chunk = request.prompt_ids[start:end]
    last = start + len(chunk) == len(request.prompt_ids)
    logits_from = 0 if request.params.prompt_logprobs is not None else (len(chunk) - 1 if last else len(chunk))
    return RowInput(strategy.prefill_slot, start, chunk, logits_from, hidden_layers=strategy.hidden_layers)


def runs_vision_tower(strategy: DecodingStrategy, chunk: RowInput) -> bool:
    """Whether ``chunk`` reaches an image of its request whose features the vision tower has yet to compute."""
    image_prompt = strategy.request.image_prompt
    if image_prompt is None or image_prompt.features is not None:
        return False
    positions = image_prompt.positions
    return bool(((positions >= chunk.start) & (positions < chunk.start + len(chunk.token_ids))).any())


def consume_chunk(
    strategy: DecodingStrategy, chunk: RowInput, logits: torch.Tensor, token_text: TokenText
) -> list[Pick]:
    """Book a chunk just run (``logits``: ``[num_kept, vocab_size]``); start decoding after the last."""
    request = strategy.request
    if request.params.prompt_logprobs is not None:
        _collect_prompt_logprobs(request, chunk.start, logits, token_text)
    request.num_prefilled += len(chunk.token_ids)
    # full blocks of the prompt so far serve later requests with the same start (prefix caching)
    strategy.ctx.pool.register(chunk.slot, request.prompt_ids[: request.num_prefilled])
    strategy.consume_prompt_chunk(chunk)
    if not request.prefill_done:
        return []
    if request.image_prompt is not None:  # the prompt is in: its pixels and image features are not needed again
        request.image_prompt.let_go()
    return strategy.start(logits[-1], chunk)


def _collect_prompt_logprobs(request: Request, start: int, logits: torch.Tensor, token_text: TokenText) -> None:
    # logits[i] predicts prompt token start + i + 1
    if request.prompt_logprobs is None:
        first = request.prompt_ids[0]
        request.prompt_logprobs = [TokenLogprob(first, token_text(first), None)]
    targets = request.prompt_ids[start + 1 : start + 1 + logits.shape[0]]
    request.prompt_logprobs.extend(
        prompt_logprob_entries(logits[: len(targets)], targets, request.params.prompt_logprobs, token_text)
    )
