"""The green-list watermark: the batched logits processor and the detector.

Kirchenbauer et al. 2023 (https://arxiv.org/abs/2301.10226), matching transformers'
``WatermarkLogitsProcessor`` and ``WatermarkDetector`` (generation/logits_process.py,
generation/watermarking.py) bit for bit: the same seeds from the same hashes of the previous
token(s), the same ``torch.randperm`` of the vocabulary drawn from a generator seeded with them, the
same green fraction, the same ``+ bias`` on the green logits, selfhash's same search over the 40
best candidates, and the detector's same n-gram scoring, z-score and p-value.

One divergence, on purpose: HF draws its permutations on the model's device, so its CUDA green
lists differ from its CPU ones and text watermarked on a GPU is only detected by a detector told
that GPU. Here green lists are always drawn on the CPU (and moved to the scores' device), so text
watermarked by any replica is detected by any other, and by HF's ``WatermarkDetector(device="cpu")``.

A green list is a pure function of (seed, vocabulary size, green-list size), so it is memoized;
``torch.randperm`` of a 49k vocabulary costs milliseconds, and selfhash asks for up to 40 per step.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from decoding.params import ParameterError
from decoding.params.watermarking import WatermarkingConfig
from decoding.sampling.row_state import RowSamplingState

CPU = torch.device("cpu")  # where every green list is drawn (see the module docstring)
TABLE_SIZE = 1_000_003  # HF's selfhash lookup table
SELFHASH_CANDIDATES = 40  # HF (after the original repository): candidates tried per step
_U64 = 2**64


# ---- seeds (HF WatermarkLogitsProcessor.set_seed) --------------------------------------------------------
@lru_cache(maxsize=16)
def fixed_table(hashing_key: int, vocab_size: int) -> torch.Tensor:
    """HF's selfhash ``fixed_table`` (a permutation of 1_000_003 drawn once from the hashing key), cut
    to the entries token ids can reach (``t % 1_000_003`` for ``t < vocab_size``).

    Held by each watermarked row and each detection call for its whole life, so requests rotating
    through many hashing keys cost one draw per request, never one per step or per seed; the cache
    only shares the draw between requests that use the same key."""
    generator = torch.Generator(device=CPU)
    generator.manual_seed(hashing_key)
    table = torch.randperm(TABLE_SIZE, generator=generator, device=CPU)  # [TABLE_SIZE]
    return table[: min(vocab_size, TABLE_SIZE)].clone()


def _int64(value: int) -> int:
    """``value`` wrapped to a signed 64-bit integer, as HF's int64 tensor products wrap."""
    value %= _U64
    return value - _U64 if value >= 2**63 else value


def _seed(config: WatermarkingConfig, window: Sequence[int], table: torch.Tensor | None = None) -> int:
    """The generator seed of the green list for ``window`` (the tokens HF's ``set_seed`` sees:
    lefthash, the previous token(s); selfhash, the previous ``context_width - 1`` and the candidate);
    ``table``: ``fixed_table(config.hashing_key, vocab)`` (selfhash only)."""
    window = window[-config.context_width :]
    if config.seeding_scheme == "selfhash":
        return int(_selfhash_seeds(config, list(window[:-1]), [window[-1]], table)[0])
    return (config.hashing_key * window[-1]) % (_U64 - 1)


def _selfhash_seeds(
    config: WatermarkingConfig, context: list[int], candidates: list[int], table: torch.Tensor
) -> list[int]:
    """Selfhash seeds of ``context + [c]`` for every candidate ``c`` at once: HF's int64 products
    (which wrap) ``key * (table[t] + 1) * (table[c] + 1)`` over the window, their minimum, mod 2**64 - 1;
    one tensor op however wide the context is."""
    size = table.shape[0]
    tokens = torch.tensor(context, dtype=torch.long, device=CPU) % TABLE_SIZE  # [width - 1]
    chosen = torch.tensor(candidates, dtype=torch.long, device=CPU) % TABLE_SIZE  # [num_candidates]
    if size < TABLE_SIZE:  # ids beyond the cut table cannot occur: they are token ids below vocab_size
        tokens, chosen = tokens.clamp(max=size - 1), chosen.clamp(max=size - 1)
    b = table[chosen] + 1  # [num_candidates]
    key = torch.tensor(_int64(config.hashing_key), dtype=torch.long, device=CPU)
    window = torch.cat([table[tokens].expand(len(candidates), -1), table[chosen][:, None]], dim=1) + 1
    products = key * window * b[:, None]  # [num_candidates, width], int64 wrapping as HF's
    return [int(v) % (_U64 - 1) for v in products.min(dim=1).values.tolist()]


def greenlist_size(config: WatermarkingConfig, vocab_size: int) -> int:
    return int(vocab_size * config.greenlist_ratio)


@lru_cache(maxsize=512)
def _green_mask(seed: int, vocab_size: int, size: int) -> torch.Tensor:
    """``[vocab_size]`` bool: the first ``size`` ids of HF's seeded vocabulary permutation."""
    generator = torch.Generator(device=CPU)
    generator.manual_seed(seed)
    permutation = torch.randperm(vocab_size, generator=generator, device=CPU)  # [vocab_size]
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=CPU)
    mask[permutation[:size]] = True
    return mask


@lru_cache(maxsize=1 << 16)
def _is_green(seed: int, vocab_size: int, size: int, token: int) -> bool:
    return bool(_green_mask(seed, vocab_size, size)[token])


def is_green(
    config: WatermarkingConfig, vocab_size: int, window: Sequence[int], table: torch.Tensor | None = None
) -> bool:
    """Whether ``window[-1]`` is green: seeded by the tokens before it (lefthash) or by the window
    itself (selfhash), as HF's detector scores an n-gram."""
    if config.seeding_scheme == "selfhash" and table is None:
        table = fixed_table(config.hashing_key, vocab_size)
    seed = _seed(config, window if config.seeding_scheme == "selfhash" else window[:-1], table)
    return _is_green(seed, vocab_size, greenlist_size(config, vocab_size), window[-1])


# ---- the processor ---------------------------------------------------------------------------------------
class WatermarkProcessor:
    """HF's ``WatermarkLogitsProcessor`` over the rows of a batch that carry a watermark, each with its
    own config and history: one green mask per row, then one ``torch.where`` adding each row's bias.

    ``rows`` are ``(batch index, row state)``; the state's ``history`` (prompt + output, HF's
    ``input_ids`` row) is read when ``apply`` runs, so a batch kept across steps sees new tokens.
    """

    def __init__(self, rows: list[tuple[int, RowSamplingState]], vocab_size: int) -> None:
        self.rows = rows
        self.vocab_size = vocab_size

    def apply(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores``: ``[num_rows, vocab_size]`` after every other processor and warper (HF puts the
        watermark last, before only ``LogitNormalization``); returns them with the bias on green ids."""
        picked, masks, biases = [], [], []
        for i, state in self.rows:
            config, history = state.params.watermarking_config, state.history
            if len(history) < config.context_width:  # HF skips seeding until the context is long enough
                continue
            picked.append(i)
            masks.append(self._green(state, scores[i]))
            biases.append(config.bias)
        if not picked:
            return scores
        device = scores.device
        index = torch.tensor(picked, dtype=torch.long, device=device)
        mask = torch.stack(masks).to(device)  # [num_picked, vocab_size]
        rows = scores[index]  # [num_picked, vocab_size]
        # HF adds a Python float to float32 scores: torch casts it to float32 first, as this tensor is
        bias = torch.tensor(biases, dtype=rows.dtype, device=device)[:, None]  # [num_picked, 1]
        scores[index] = torch.where(mask, rows + bias, rows)
        return scores

    def _green(self, state: RowSamplingState, row_scores: torch.Tensor) -> torch.Tensor:
        """``[vocab_size]`` bool mask of the ids this row's bias goes to."""
        config, history = state.params.watermarking_config, state.history
        size = greenlist_size(config, self.vocab_size)
        if config.seeding_scheme == "lefthash":
            return _green_mask(_seed(config, history), self.vocab_size, size)
        # selfhash (HF ``_score_rejection_sampling``): of the 40 best candidates, those green in the
        # list their own id seeds, with the previous context_width - 1 tokens
        _, order = row_scores.sort(dim=-1, descending=True)
        candidates = order[:SELFHASH_CANDIDATES].tolist()
        context = history[len(history) - (config.context_width - 1) :] if config.context_width > 1 else []
        if state.watermark_table is None:  # drawn once for the row's life (see fixed_table)
            state.watermark_table = fixed_table(config.hashing_key, self.vocab_size)
        mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=CPU)
        for token, seed in zip(candidates, _selfhash_seeds(config, context, candidates, state.watermark_table),
                               strict=True):  # fmt: skip
            if _is_green(seed, self.vocab_size, size, token):
                mask[token] = True
        return mask


# ---- the detector ----------------------------------------------------------------------------------------
class DetectionCancelled(Exception):
    """The caller no longer wants the score (its client left)."""


@dataclass(frozen=True)
class WatermarkDetection:
    """HF's ``WatermarkDetectorOutput`` for one sequence (its ``confidence`` is ``1 - p_value``)."""

    num_tokens_scored: int
    num_green_tokens: int
    green_fraction: float
    z_score: float
    p_value: float
    prediction: bool


def min_tokens_to_score(config: WatermarkingConfig) -> int:
    """HF's detector needs ``context_width`` seeding tokens and at least one token to score."""
    return config.context_width + 1


def detect_watermark(
    token_ids: Sequence[int],
    config: WatermarkingConfig,
    vocab_size: int,
    *,
    bos_token_id: int | None = None,
    z_threshold: float = 3.0,
    ignore_repeated_ngrams: bool = False,
    param: str = "token_ids",
    cancelled: Callable[[], bool] | None = None,
) -> WatermarkDetection:
    """HF's ``WatermarkDetector.__call__(..., return_dict=True)`` on one sequence.

    ``cancelled`` is asked between n-grams (each may cost a permutation of the vocabulary): when it
    says yes, ``DetectionCancelled`` ends the scoring. A leading BOS is dropped, as HF does. Too few
    tokens is a ``ParameterError`` on ``param`` that says how many are needed. ``vocab_size`` is the
    model's (the logits' width), as generation used.
    """
    ids = [int(t) for t in token_ids]
    if ids and bos_token_id is not None and ids[0] == bos_token_id:
        ids = ids[1:]
    needed = min_tokens_to_score(config)
    if len(ids) < needed:
        raise ParameterError(
            f"{param} is too short to score: the watermark needs at least {needed} tokens (context_width "
            f"{config.context_width} to seed, then 1 to score), got {len(ids)}"
            + (" after the leading BOS" if len(ids) != len(token_ids) else ""),
            param=param,
            code="too_short",
        )
    width = config.context_width + (0 if config.seeding_scheme == "selfhash" else 1)  # HF's n-gram length
    frequencies = Counter(tuple(ids[i : i + width]) for i in range(len(ids) - width + 1))
    table = fixed_table(config.hashing_key, vocab_size) if config.seeding_scheme == "selfhash" else None
    green = {}
    for count, ngram in enumerate(frequencies):  # each may draw a fresh permutation: check the caller often
        if cancelled is not None and count % 32 == 0 and cancelled():
            raise DetectionCancelled
        green[ngram] = is_green(config, vocab_size, ngram, table)
    if ignore_repeated_ngrams:  # each distinct n-gram counted once
        scored, num_green = len(frequencies), sum(green.values())
    else:
        scored = sum(frequencies.values())
        num_green = sum(count for ngram, count in frequencies.items() if green[ngram])
    ratio = config.greenlist_ratio
    z = (num_green - ratio * scored) / math.sqrt(scored * ratio * (1 - ratio))
    return WatermarkDetection(
        num_tokens_scored=scored,
        num_green_tokens=num_green,
        green_fraction=num_green / scored,
        z_score=z,
        p_value=0.5 * math.erfc(z / math.sqrt(2)),
        prediction=z > z_threshold,
    )
