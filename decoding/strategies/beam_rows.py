"""A beam request inside the continuous batch: its rows, its KV slot moves, its final choices.

``BeamSearch`` decides; this module carries the decisions out on the shared KV pool. A beam
request holds ``num_beams`` slots. After each step every new beam must see its parent's cache:
the first child of a parent simply inherits the parent's slot, and only further children copy the
parent's cache into a slot a childless beam gave up, so a step copies at most the request's own
rows and often none (HF instead re-indexes the whole cache every step).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from decoding.kv_cache import KVPool
from decoding.model_runner import RowInput
from decoding.outputs import FinishReason
from decoding.request import Request
from decoding.strategies.beam import BeamSearch
from decoding.strategies.group_beam import GroupBeamSearch
from decoding.token_logprobs import TokenText, token_logprob


def make_beam_search(
    request: Request,
    eos_token_ids: list[int],
    pad_token_id: int,
    vocab_size: int,
    max_model_len: int,
    generator: torch.Generator | None,
    decode: Callable[[list[int]], str],
    token_text: TokenText,
) -> BeamSearch | GroupBeamSearch:
    params = request.params
    stop_token_ids = set(params.stop_token_ids)

    def stops(generated_ids: list[int]) -> bool:
        if generated_ids[-1] in stop_token_ids:
            return True
        return bool(params.stop) and any(s in decode(generated_ids) for s in params.stop)

    def logprob_entry(log_probs: torch.Tensor, token: int):  # noqa: ANN202
        return token_logprob(log_probs, token, params.logprobs, token_text)

    max_new_tokens = min(params.max_new_tokens, max_model_len - len(request.prompt_ids))
    logprobs = logprob_entry if params.logprobs is not None else None
    if params.num_beam_groups > 1:
        return GroupBeamSearch(
            params, request.prompt_ids, eos_token_ids, pad_token_id, vocab_size, max_new_tokens, stops, logprobs
        )
    return BeamSearch(
        params,
        request.prompt_ids,
        eos_token_ids,
        vocab_size,
        max_new_tokens=max_new_tokens,
        generator=generator,
        stops=stops,
        token_logprob=logprobs,
    )


def plan_beam_rows(request: Request) -> list[RowInput]:
    """One decode row per running beam: its last token at the beams' common length."""
    return [
        RowInput(slot, request.beam_num_cached, [token], 0)
        for slot, token in zip(request.beam_slots, request.beam_next_tokens, strict=True)
    ]


def advance_beams(request: Request, logits: torch.Tensor, pool: KVPool, *, first: bool) -> bool:
    """Run one search step on ``logits`` ``[num_beams, vocab_size]``, move the caches; True when done.

    ``first``: the step right after prefill, when only the first slot holds the prompt (every beam
    is still the prompt itself, so every parent's cache is that slot).
    """
    step = request.beam.step(logits)
    old = request.beam_slots
    sources = [old[0] if first else old[parent] for parent in step.parents]
    new_slots: list[int | None] = [None] * len(sources)
    inherited: set[int] = set()
    for j, source in enumerate(sources):
        if source not in inherited:
            new_slots[j] = source
            inherited.add(source)
    spare = [slot for slot in old if slot not in inherited]
    for j, source in enumerate(sources):
        if new_slots[j] is None:  # a second child of one parent: copy only this request's rows
            new_slots[j] = spare.pop()
            pool.copy_prefix(source, new_slots[j], request.beam_num_cached)
    request.beam_slots = new_slots
    request.beam_next_tokens = step.tokens
    return step.done


def finish_beams(request: Request, eos_token_ids: set[int]) -> int:
    """Hand the best ``n`` hypotheses to the request's choices, best first; returns their tokens.

    Beams can change until the search ends, so a beam request's text is released only now,
    through the same streamers (stop strings are cut as in any other request).
    """
    params = request.params
    results = request.beam.results(len(request.rows))
    eos = set() if params.ignore_eos else eos_token_ids
    total = 0
    for row, result in zip(request.rows, results, strict=True):
        ids = result.token_ids
        total += len(ids)
        row.output_ids = list(ids)
        row.pending_ids = list(ids)
        if params.logprobs is not None:
            row.pending_logprobs = result.logprobs
            row.sequence_score = result.score
        ends_with_token_stop = bool(ids) and (ids[-1] in eos or ids[-1] in params.stop_token_ids)
        row.streamer.put(ids[:-1] if ends_with_token_stop else ids)
        if result.hit_stop:
            row.finish_reason = FinishReason.STOP
            if ids and ids[-1] in params.stop_token_ids:
                row.stop_reason = ids[-1]
            else:
                row.stop_reason = row.streamer.stop_reason
        else:
            row.finish_reason = FinishReason.LENGTH
        row.streamer.end()
    return total
