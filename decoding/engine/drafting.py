"""The drafting stage: draft tokens for every speculative row of a step, before the target runs.

Batched per proposer. Prompt lookup needs no model. Early exit runs the target's first layers
(into the target's own slots: the verifying forward rewrites the same positions); rows asking for
different exit depths are drafted in separate groups. An assistant model runs in its own KV pool,
with a slot per row that it keeps across steps: each step it first catches up on the tokens the
target accepted since (one multi-token row), then drafts greedily, one batched forward per draft
position for all rows sharing that assistant.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from decoding.kv.pool import KVPool
from decoding.model.runner import ModelRunner, RowInput
from decoding.sampling.batch import SamplingBatch
from decoding.sampling.fast_argmax import argmax_rows
from decoding.strategies.base import DraftJob
from decoding.strategies.speculative import EARLY_EXIT, PROMPT_LOOKUP, Speculation, propose_prompt_lookup
from decoding.strategies.universal import AssistantText, common_prefix_length, target_drafts


@dataclass
class Assistant:
    """A preloaded draft model with its own KV pool; ``tokenizer`` is set when it is not the target's
    (universal assisted decoding, drafts go through text)."""

    name: str
    runner: ModelRunner
    pool: KVPool
    tokenizer: object | None = None
    eos_token_ids: set[int] = field(default_factory=set)


class Drafter:
    def __init__(
        self,
        target: ModelRunner,
        assistants: dict[str, Assistant],
        eos_token_ids: set[int],
        target_tokenizer: object | None = None,
    ) -> None:
        self.target = target
        self.assistants = assistants
        self.eos_token_ids = eos_token_ids
        self.target_tokenizer = target_tokenizer
        # An assistant larger than the target costs more than a target step per draft token, so its
        # drafts can never pay for themselves in greedy decoding: such an assistant never drafts.
        target_size = _num_parameters(target.model)
        self.too_costly = {
            name for name, assistant in assistants.items() if _num_parameters(assistant.runner.model) > target_size
        }
        # a draft forward's cost in target steps, from the weights it reads (decode is bandwidth-bound)
        self.relative_cost = {
            name: _num_parameters(assistant.runner.model) / target_size for name, assistant in assistants.items()
        }

    def draft(self, jobs: list[DraftJob]) -> None:
        """Fill ``job.spec.drafts`` for each job, at most ``job.limit`` drafts each."""
        groups: dict[tuple[str, int], list[tuple[DraftJob, int]]] = {}
        for job in jobs:
            spec = job.spec
            count = spec.length.next(job.limit)
            spec.drafts = []
            spec.draft_seconds = 0.0
            spec.draft_cost_steps = 0.0
            if count <= 0 or spec.proposer in self.too_costly:
                continue
            if spec.proposer == PROMPT_LOOKUP:
                history = job.row.sampling.history
                predicted = job.row.sampling.params.prediction_ids  # OpenAI's prediction: searched first
                source = predicted + history if predicted else history
                spec.drafts = propose_prompt_lookup(source, count, spec.max_ngram_size, self.eos_token_ids)
            else:
                groups.setdefault((spec.proposer, spec.early_exit_layers), []).append((job, count))
        for (proposer, exit_layers), group in groups.items():
            started = time.perf_counter()
            if proposer == EARLY_EXIT:
                self._draft_early_exit(group, exit_layers)
            elif self.assistants[proposer].tokenizer is not None:
                self._draft_through_text(group, self.assistants[proposer])
            else:
                self._draft_same_vocabulary(group, self.assistants[proposer])
            elapsed = time.perf_counter() - started
            early = proposer == EARLY_EXIT
            per_forward = exit_layers / self.target.num_layers if early else self.relative_cost[proposer]
            for job, _ in group:
                job.spec.draft_seconds = elapsed
                job.spec.draft_cost_steps = per_forward * len(job.spec.drafts)

    def _draft_early_exit(self, group: list[tuple[DraftJob, int]], num_layers: int) -> None:
        # the target's own slot: only the last token is new
        inputs = [RowInput(job.row.slot, job.row.num_cached, [job.row.output_ids[-1]], 0) for job, _ in group]
        drafted, _ = self._greedy(self.target, group, inputs, self.eos_token_ids, num_layers)
        for (job, _), tokens in zip(group, drafted, strict=True):
            job.spec.drafts = tokens

    def _draft_same_vocabulary(self, group: list[tuple[DraftJob, int]], assistant: Assistant) -> None:
        inputs = []
        for job, _ in group:
            spec = self._assistant_slot(job.spec, assistant)
            pending = job.row.sampling.history[spec.assistant_cached :]
            inputs.append(RowInput(spec.assistant_slot, spec.assistant_cached, pending, len(pending) - 1))
        drafted, cached = self._greedy(assistant.runner, group, inputs, self.eos_token_ids, None)
        for (job, _), tokens, position in zip(group, drafted, cached, strict=True):
            job.spec.drafts = tokens
            job.spec.assistant_cached = position

    def _draft_through_text(self, group: list[tuple[DraftJob, int]], assistant: Assistant) -> None:
        inputs, fitting = [], []
        for job, count in group:
            spec = self._assistant_slot(job.spec, assistant)
            if spec.text is None:
                prompt = job.row.sampling.history[: len(job.row.sampling.history) - len(job.row.output_ids)]
                spec.text = AssistantText(self.target_tokenizer, assistant.tokenizer, prompt)
            stable = len(spec.text.frozen_ids)  # ids both encodings share for certain
            ids = spec.text.ids_for(job.row.sampling.history)
            if len(ids) + count > assistant.pool.max_model_len:  # the text outgrew the assistant's slot
                continue
            cached = min(spec.assistant_cached, common_prefix_length(spec.assistant_ids, ids, stable), len(ids) - 1)
            spec.assistant_ids = ids
            pending = ids[cached:]
            inputs.append(RowInput(spec.assistant_slot, cached, pending, len(pending) - 1))
            fitting.append((job, count))
        group = fitting
        # another vocabulary: no q over the target's tokens, so sampled rows match picks instead
        drafted, cached = self._greedy(assistant.runner, group, inputs, assistant.eos_token_ids, None, False)
        for (job, count), tokens, position in zip(group, drafted, cached, strict=True):
            spec = job.spec
            spec.assistant_cached = position
            spec.assistant_ids.extend(tokens[:-1])  # what the assistant's cache now holds
            draft_text = assistant.tokenizer.decode(tokens, skip_special_tokens=True)
            spec.drafts = target_drafts(job.row.sampling.history, draft_text, self.target_tokenizer, count)

    @staticmethod
    def _assistant_slot(spec: Speculation, assistant: Assistant) -> Speculation:
        if spec.assistant_slot is None:
            spec.assistant_slot = assistant.pool.allocate()
            spec.assistant_pool = assistant.pool
            spec.assistant_cached = 0
            spec.through_text = assistant.tokenizer is not None
        return spec

    def _greedy(
        self,
        runner: ModelRunner,
        group: list[tuple[DraftJob, int]],
        inputs: list[RowInput],
        eos_token_ids: set[int],
        early_exit: int | None,
        sample_drafts: bool = True,
    ) -> tuple[list[list[int]], list[int]]:
        """Drafts, one batched forward per position (the first also catches up): greedy, or for
        sampling rows drawn from the proposer's processed distribution q (kept in
        ``draft_probs`` for rejection sampling); returns each row's drafts and how many positions
        its slot now holds."""
        for job, _ in group:
            job.spec.draft_probs = []
        drafted: list[list[int]] = [[] for _ in group]
        cached = [row_input.start for row_input in inputs]
        active = list(range(len(group)))
        while active:
            logits = runner.forward([inputs[i] for i in active], num_layers=early_exit)
            still = []
            for j, i in enumerate(active):
                job, count = group[i]
                if sample_drafts and job.row.sampling.params.do_sample:
                    token = self._sample_draft(job, logits[j][-1])
                else:
                    token = int(argmax_rows(logits[j][-1:])[0])
                drafted[i].append(token)
                cached[i] = inputs[i].start + len(inputs[i].token_ids)
                # HF's ConfidenceCriteria: the doubtful draft is kept, drafting stops after it
                threshold = job.spec.confidence_threshold
                confident = threshold is None or float(torch.softmax(logits[j][-1], -1)[token]) >= threshold
                if len(drafted[i]) < count and token not in eos_token_ids and confident:
                    inputs[i] = RowInput(inputs[i].slot, cached[i], [token], 0)
                    still.append(i)
            active = still
        return drafted, cached

    @staticmethod
    def _sample_draft(job: DraftJob, logits: torch.Tensor) -> int:
        """A draft drawn from q = the row's processors and warpers applied to the proposer's logits."""
        sampling = job.row.sampling
        probs = torch.softmax(SamplingBatch.for_row(sampling).process(logits[None]), dim=-1)[0]  # [vocab_size]
        token = int(torch.multinomial(probs, 1, generator=sampling.generator))
        job.spec.draft_probs.append(probs)
        return token


def make_assistant(
    name: str,
    model: torch.nn.Module,
    num_slots: int,
    max_model_len: int,
    device: torch.device,
    tokenizer: object | None = None,
    eos_token_ids: set[int] | None = None,
    num_blocks: int | None = None,
) -> Assistant:
    """An assistant with its own paged pool (``num_blocks``; no prefix caching: its rows follow the
    target's, which already reuses prompts). A pool that runs out only costs drafts."""
    pool = KVPool.for_model(
        model, num_slots=num_slots, max_model_len=max_model_len, device=device, num_blocks=num_blocks,
        prefix_caching=False,
    )  # fmt: skip
    return Assistant(name, ModelRunner(model, pool, device), pool, tokenizer, set(eos_token_ids or ()))


def _num_parameters(model: torch.nn.Module) -> int:
    """Weights the model reads per token, whatever their layout: a packed or quantized linear keeps
    its matrix outside ``parameters()``, so it counts by its shape."""
    total = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        if getattr(module, "owns_its_tensors", False):  # a low-bit matrix: its linear counted it
            continue
        if "weight" not in module._parameters and hasattr(module, "in_features") and hasattr(module, "out_features"):
            total += module.in_features * module.out_features
    return total
