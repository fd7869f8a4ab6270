"""Draft tokens for every speculative row of a step, batched per proposer, before the target runs.

Prompt lookup needs no model. Early exit runs the target's first layers (into the target's own
slots: the verifying forward rewrites the same positions). An assistant model runs in its own KV
pool, with a slot per row that it keeps across steps: each step it first catches up on the tokens
the target accepted since (one multi-token row), then drafts greedily, one batched forward per
draft position for all rows sharing that assistant.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from decoding.kv_cache import KVPool
from decoding.model_runner import ModelRunner, RowInput
from decoding.request import Request, Row
from decoding.sampling import SamplingBatch
from decoding.strategies.speculative import EARLY_EXIT, PROMPT_LOOKUP, propose_prompt_lookup
from decoding.strategies.universal import assistant_ids_for, common_prefix_length, target_drafts


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

    def draft(self, rows: list[tuple[Request, Row, int]]) -> None:
        """Fill ``row.speculation.drafts`` for each ``(request, row, limit)``; limit caps the count."""
        by_model: dict[str, list[tuple[Row, int]]] = {}
        for _, row, limit in rows:
            spec = row.speculation
            count = spec.length.next(limit)
            spec.drafts = []
            spec.draft_seconds = 0.0
            if count <= 0:
                continue
            if spec.proposer in self.too_costly:
                continue
            if spec.proposer == PROMPT_LOOKUP:
                spec.drafts = propose_prompt_lookup(
                    row.sampling.history, count, spec.max_ngram_size, self.eos_token_ids
                )
            else:
                by_model.setdefault(spec.proposer, []).append((row, count))
        for proposer, group in by_model.items():
            assistant = None if proposer == EARLY_EXIT else self.assistants[proposer]
            started = time.perf_counter()
            if assistant is not None and assistant.tokenizer is not None:
                self._draft_through_text(group, assistant)
            else:
                self._draft_same_vocabulary(group, assistant)
            elapsed = time.perf_counter() - started
            for row, _ in group:
                row.speculation.draft_seconds = elapsed

    def _draft_same_vocabulary(self, group: list[tuple[Row, int]], assistant: Assistant | None) -> None:
        inputs = []
        for row, _ in group:
            spec = row.speculation
            if assistant is None:  # early exit: the target's own slot, only the last token is new
                inputs.append(RowInput(row.slot, row.num_cached, [row.output_ids[-1]], 0))
                continue
            if spec.assistant_slot is None:
                spec.assistant_slot = assistant.pool.allocate()
                spec.assistant_cached = 0
            pending = row.sampling.history[spec.assistant_cached :]
            inputs.append(RowInput(spec.assistant_slot, spec.assistant_cached, pending, len(pending) - 1))
        early_exit = group[0][0].speculation.early_exit_layers if assistant is None else None
        runner = self.target if assistant is None else assistant.runner
        drafted, cached = self._greedy(runner, group, inputs, self.eos_token_ids, early_exit)
        for (row, _), tokens, position in zip(group, drafted, cached, strict=True):
            row.speculation.drafts = tokens
            if assistant is not None:
                row.speculation.assistant_cached = position

    def _draft_through_text(self, group: list[tuple[Row, int]], assistant: Assistant) -> None:
        inputs, texts = [], []
        for row, _ in group:
            spec = row.speculation
            if spec.assistant_slot is None:
                spec.assistant_slot = assistant.pool.allocate()
                spec.assistant_cached = 0
            text = self.target_tokenizer.decode(row.sampling.history)
            ids = assistant_ids_for(text, assistant.tokenizer)
            cached = min(spec.assistant_cached, common_prefix_length(spec.assistant_ids, ids), len(ids) - 1)
            spec.assistant_ids = ids
            pending = ids[cached:]
            inputs.append(RowInput(spec.assistant_slot, cached, pending, len(pending) - 1))
            texts.append(text)
        # another vocabulary: no q over the target's tokens, so sampled rows match picks instead
        drafted, cached = self._greedy(assistant.runner, group, inputs, assistant.eos_token_ids, None, False)
        for (row, count), tokens, position in zip(group, drafted, cached, strict=True):
            spec = row.speculation
            spec.assistant_cached = position
            spec.assistant_ids = spec.assistant_ids + tokens[:-1]  # what the assistant's cache now holds
            draft_text = assistant.tokenizer.decode(tokens, skip_special_tokens=True)
            spec.drafts = target_drafts(row.sampling.history, draft_text, self.target_tokenizer, count)

    def _greedy(
        self,
        runner: ModelRunner,
        group: list[tuple[Row, int]],
        inputs: list[RowInput],
        eos_token_ids: set[int],
        early_exit: int | None,
        sample_drafts: bool = True,
    ) -> tuple[list[list[int]], list[int]]:
        """Drafts, one batched forward per position (the first also catches up): greedy, or for
        sampling rows drawn from the proposer's processed distribution q (kept in
        ``draft_probs`` for rejection sampling); returns each row's drafts and how many positions
        its slot now holds."""
        for row, _ in group:
            row.speculation.draft_probs = []
        drafted: list[list[int]] = [[] for _ in group]
        cached = [row_input.start for row_input in inputs]
        active = list(range(len(group)))
        while active:
            logits = runner.forward([inputs[i] for i in active], num_layers=early_exit)
            still = []
            for j, i in enumerate(active):
                row = group[i][0]
                spec = row.speculation
                if sample_drafts and row.sampling.params.do_sample:
                    token = self._sample_draft(row, logits[j][-1])
                else:
                    token = int(logits[j][-1].argmax())
                drafted[i].append(token)
                cached[i] = inputs[i].start + len(inputs[i].token_ids)
                # HF's ConfidenceCriteria: the doubtful draft is kept, drafting stops after it
                threshold = spec.confidence_threshold
                confident = threshold is None or float(torch.softmax(logits[j][-1], -1)[token]) >= threshold
                if len(drafted[i]) < group[i][1] and token not in eos_token_ids and confident:
                    inputs[i] = RowInput(inputs[i].slot, cached[i], [token], 0)
                    still.append(i)
            active = still
        return drafted, cached

    @staticmethod
    def _sample_draft(row: Row, logits: torch.Tensor) -> int:
        """A draft drawn from q = the row's processors and warpers applied to the proposer's logits."""
        batch = SamplingBatch.from_rows([row.sampling], logits.device)
        probs = torch.softmax(batch.process(logits[None]), dim=-1)[0]  # [vocab_size]
        token = int(torch.multinomial(probs, 1, generator=row.sampling.generator))
        row.speculation.draft_probs.append(probs)
        return token

    def rollback(self, row: Row, history_length: int) -> None:
        """After verification: the assistant keeps only K/V of tokens that are still history
        (through-text assistants realign by their own ids at the next draft instead)."""
        spec = row.speculation
        assistant = self.assistants.get(spec.proposer)
        if assistant is None or assistant.tokenizer is None:
            spec.assistant_cached = min(spec.assistant_cached, history_length)

    def release(self, request: Request) -> None:
        for row in request.rows:
            spec = row.speculation
            if spec is not None and spec.assistant_slot is not None:
                self.assistants[spec.proposer].pool.free(spec.assistant_slot)
                spec.assistant_slot = None


def make_assistant(
    name: str,
    model: torch.nn.Module,
    num_slots: int,
    max_model_len: int,
    device: torch.device,
    tokenizer: object | None = None,
    eos_token_ids: set[int] | None = None,
) -> Assistant:
    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    pool = KVPool(
        num_layers=config.num_hidden_layers,
        num_slots=num_slots,
        num_kv_heads=config.num_key_value_heads,
        head_dim=head_dim,
        max_model_len=max_model_len,
        dtype=next(model.parameters()).dtype,
        device=device,
    )
    return Assistant(name, ModelRunner(model, pool, device), pool, tokenizer, set(eos_token_ids or ()))


def _num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
