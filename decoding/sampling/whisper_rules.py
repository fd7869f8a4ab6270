"""Whisper's suppressions and timestamp rules over a step's scores (``decoding/params/whisper.py``).

They follow HF's ``SuppressTokensAtBeginLogitsProcessor``, ``SuppressTokensLogitsProcessor`` and
``WhisperTimeStampLogitsProcessor``, in that order, after every other processor and warper, as
``WhisperForConditionalGeneration.generate()`` appends them. The timestamp rules read each row's own
transcript: timestamps come in pairs (a lone one is followed by another or by end of text), never go
back, the first one is a timestamp no later than ``max_initial_timestamp_index``, and where the
timestamps together are likelier than any text token, a timestamp is what comes next.
"""

from __future__ import annotations

import torch

from decoding.params.whisper import WhisperRules

NEG_INF = float("-inf")


def apply_whisper_rules(scores: torch.Tensor, rows: list[int], histories: list[list[int]],
                        rules: list[WhisperRules]) -> None:  # fmt: skip
    """Mask ``scores`` (``[num_rows, vocab]``) in place for the Whisper ``rows``; ``histories``: each one's
    decoder prompt and transcript so far, as HF's ``input_ids``."""
    for row, history, rule in zip(rows, histories, rules, strict=True):
        first = len(history) == rule.begin_index
        if first and rule.begin_suppress_tokens:
            scores[row, list(rule.begin_suppress_tokens)] = NEG_INF
        if rule.suppress_tokens:
            scores[row, list(rule.suppress_tokens)] = NEG_INF
        if rule.timestamps:
            _timestamp_rules(scores, row, history[rule.begin_index :], rule, first)


def _timestamp_rules(scores: torch.Tensor, row: int, said: list[int], rule: WhisperRules, first: bool) -> None:
    begin = rule.timestamp_begin
    scores[row, rule.no_timestamps_token_id] = NEG_INF
    last_was_timestamp = len(said) >= 1 and said[-1] >= begin
    penultimate_was_timestamp = len(said) < 2 or said[-2] >= begin
    if last_was_timestamp:
        if penultimate_was_timestamp:  # a pair just closed: text (or end of text) next
            scores[row, begin:] = NEG_INF
        else:  # a lone timestamp: another, or end of text
            scores[row, : rule.eos_token_id] = NEG_INF
    timestamps = [token for token in said if token >= begin]
    if timestamps:  # never going back; a closed pair's end may not be said again
        last = timestamps[-1] if last_was_timestamp and not penultimate_was_timestamp else timestamps[-1] + 1
        scores[row, begin:last] = NEG_INF
    if first:
        scores[row, :begin] = NEG_INF
        if rule.max_initial_timestamp_index is not None:
            scores[row, begin + rule.max_initial_timestamp_index + 1 :] = NEG_INF
    logprobs = torch.log_softmax(scores[row].float(), dim=-1)
    if logprobs[begin:].logsumexp(dim=-1) > logprobs[:begin].max():
        scores[row, :begin] = NEG_INF
