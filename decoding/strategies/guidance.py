"""Classifier-free guidance (Sanchez et al. 2023, "Stay on topic with Classifier-Free Guidance",
https://huggingface.co/papers/2306.17806) on top of greedy search or sampling.

Every returned row gets a twin, the unconditional row: its own KV slot, fed the negative prompt
(or, without one, only the prompt's last token, as HF does), then each token the conditional row
commits. Both rows ride in the engine's one batched forward: the unconditional branch is never an
extra model call. Each step the two rows' logits are mixed exactly as transformers'
``UnbatchedClassifierFreeGuidanceLogitsProcessor`` mixes them::

    scores = guidance_scale * (log_softmax(cond) - log_softmax(uncond)) + log_softmax(uncond)

HF applies that processor first, before any other, so the mixed scores are handed to the batched
sampler as the row's ``Pick`` logits and every other knob (penalties, warpers, the draw) follows
unchanged. The reported logprobs are those of the guided distribution, the one tokens are picked from.

The negative prompt needs its own prefill, which only the strategy knows about: after the engine
has prefilled the prompt, ``plan`` feeds the negative prompt into the first unconditional slot (in
chunks), copies it to the other rows' twins, and only then picks the first token (one step later
than a plain request).
"""

from __future__ import annotations

import torch

from decoding.model.runner import RowInput
from decoding.state.context import EngineContext
from decoding.state.request import Request
from decoding.strategies.base import Fed, Pick
from decoding.strategies.plain import PlainDecoding

NEGATIVE_PROMPT_CHUNK = 256  # negative-prompt tokens fed per step (the engine chunks the prompt itself)


def guided_scores(cond: torch.Tensor, uncond: torch.Tensor, guidance_scale: float) -> torch.Tensor:
    """HF's CFG mix of conditional and unconditional logits (``[..., vocab_size]`` each)."""
    cond = torch.nn.functional.log_softmax(cond, dim=-1)
    uncond = torch.nn.functional.log_softmax(uncond, dim=-1)
    return guidance_scale * (cond - uncond) + uncond


class GuidanceDecoding(PlainDecoding):
    """Greedy or sampled rows, each paired with an unconditional row whose logits guide its picks."""

    def __init__(self, request: Request, ctx: EngineContext) -> None:
        super().__init__(request, ctx)
        params = request.params
        if params.negative_prompt is not None:  # the server tokenizes the text before submitting
            raise ValueError("negative_prompt must be tokenized into negative_prompt_ids before it reaches the engine")
        self.scale = float(params.guidance_scale)
        self.negative_ids = list(params.negative_prompt_ids or request.prompt_ids[-1:])
        self.uncond_slots: list[int | None] = [None] * len(request.rows)
        self.uncond_cached = [0] * len(request.rows)
        self.num_negative_fed = 0  # negative-prompt tokens written into the first unconditional slot
        self.cond_logits: torch.Tensor | None = None  # [vocab_size] the prompt's, until the first pick

    # ---- KV slots: one per row and one per unconditional twin ---------------------------------------
    @property
    def num_slots(self) -> int:
        return 2 * len(self.request.rows)

    def assign_slots(self, slots: list[int]) -> None:
        count = len(self.request.rows)
        super().assign_slots(slots[:count])
        self.uncond_slots = list(slots[count:])

    def held_slots(self) -> list[int]:
        return super().held_slots() + [slot for slot in self.uncond_slots if slot is not None]

    def release_slots(self) -> list[int]:
        slots = super().release_slots() + [slot for slot in self.uncond_slots if slot is not None]
        self.uncond_slots = [None] * len(self.uncond_slots)
        return slots

    # ---- the step ----------------------------------------------------------------------------------
    @property
    def negative_prefilled(self) -> bool:
        return self.num_negative_fed >= len(self.negative_ids)

    def start(self, last_logits: torch.Tensor, last_chunk: RowInput) -> list[Pick]:
        """The prompt is in; the first pick waits for the negative prompt's logits."""
        self.copy_prompt_to_rows()
        self.cond_logits = last_logits
        return []

    def plan(self) -> list[RowInput]:
        if not self.negative_prefilled:
            start = self.num_negative_fed
            chunk = self.negative_ids[start : start + NEGATIVE_PROMPT_CHUNK]
            last = start + len(chunk) == len(self.negative_ids)
            return [RowInput(self.uncond_slots[0], start, chunk, len(chunk) - 1 if last else len(chunk))]
        rows = []
        for index, row in enumerate(self.request.rows):
            if row.finished:
                continue
            token = [row.output_ids[-1]]
            rows.append(RowInput(row.slot, row.num_cached, token, 0))
            rows.append(RowInput(self.uncond_slots[index], self.uncond_cached[index], token, 0))
        return rows

    def consume(self, fed: list[Fed]) -> list[Pick]:
        if not self.negative_prefilled:
            ((chunk, logits),) = fed
            self.num_negative_fed += len(chunk.token_ids)
            if not self.negative_prefilled:
                return []
            return self._first_picks(logits[-1])
        live = [(index, row) for index, row in enumerate(self.request.rows) if not row.finished]
        picks = []
        for pair, (index, row) in enumerate(live):
            (_, cond), (_, uncond) = fed[2 * pair], fed[2 * pair + 1]
            row.num_cached += 1
            self.uncond_cached[index] += 1
            picks.append(Pick(self, row, guided_scores(cond[-1], uncond[-1], self.scale)))
        return picks

    def _first_picks(self, uncond_logits: torch.Tensor) -> list[Pick]:
        """The negative prompt is in: every twin starts from it, and the first tokens are picked."""
        length = len(self.negative_ids)
        first = self.uncond_slots[0]
        for index, slot in enumerate(self.uncond_slots):
            if slot != first:
                self.ctx.pool.copy_prefix(first, slot, length)
            self.uncond_cached[index] = length
        scores = guided_scores(self.cond_logits, uncond_logits, self.scale)
        self.cond_logits = None
        return [Pick(self, row, scores) for row in self.request.rows if not row.finished]
