"""Draft tokens for every speculative row of a step, batched per proposer, before the target runs.

Prompt lookup needs no model. Early exit runs the target's first layers (into the target's own
slots: the verifying forward rewrites the same positions). An assistant model runs in its own KV
pool, with a slot per row that it keeps across steps: each step it first catches up on the tokens
the target accepted since (one multi-token row), then drafts greedily, one batched forward per
draft position for all rows sharing that assistant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoding.kv_cache import KVPool
from decoding.model_runner import ModelRunner, RowInput
from decoding.request import Request, Row
from decoding.strategies.speculative import EARLY_EXIT, PROMPT_LOOKUP, propose_prompt_lookup


@dataclass
class Assistant:
    """A preloaded draft model sharing the target's tokenizer, with its own KV pool."""

    name: str
    runner: ModelRunner
    pool: KVPool


class Drafter:
    def __init__(self, target: ModelRunner, assistants: dict[str, Assistant], eos_token_ids: set[int]) -> None:
        self.target = target
        self.assistants = assistants
        self.eos_token_ids = eos_token_ids

    def draft(self, rows: list[tuple[Request, Row, int]]) -> None:
        """Fill ``row.speculation.drafts`` for each ``(request, row, limit)``; limit caps the count."""
        by_model: dict[str, list[tuple[Row, int]]] = {}
        for _, row, limit in rows:
            spec = row.speculation
            count = spec.length.next(limit)
            spec.drafts = []
            if count <= 0:
                continue
            if spec.proposer == PROMPT_LOOKUP:
                spec.drafts = propose_prompt_lookup(
                    row.sampling.history, count, spec.max_ngram_size, self.eos_token_ids
                )
            else:
                by_model.setdefault(spec.proposer, []).append((row, count))
        for proposer, group in by_model.items():
            if proposer == EARLY_EXIT:
                self._draft_with_model(group, None)
            else:
                self._draft_with_model(group, self.assistants[proposer])

    def _draft_with_model(self, group: list[tuple[Row, int]], assistant: Assistant | None) -> None:
        """Greedy drafts, one batched forward per position (the first also catches up)."""
        runner = self.target if assistant is None else assistant.runner
        inputs = []
        for row, _ in group:
            spec = row.speculation
            if assistant is None:
                inputs.append(RowInput(row.slot, row.num_cached, [row.output_ids[-1]], 0))
            else:
                if spec.assistant_slot is None:
                    spec.assistant_slot = assistant.pool.allocate()
                    spec.assistant_cached = 0
                history = row.sampling.history
                pending = history[spec.assistant_cached :]
                inputs.append(RowInput(spec.assistant_slot, spec.assistant_cached, pending, len(pending) - 1))
                spec.assistant_cached = len(history)
        early_exit = group[0][0].speculation.early_exit_layers if assistant is None else None
        active = list(range(len(group)))
        while active:
            logits = runner.forward([inputs[i] for i in active], num_layers=early_exit)
            still = []
            for j, i in enumerate(active):
                row, count = group[i]
                spec = row.speculation
                token = int(logits[j][-1].argmax())
                spec.drafts.append(token)
                position = inputs[i].start + len(inputs[i].token_ids)
                # HF's ConfidenceCriteria: the doubtful draft is kept, drafting stops after it
                threshold = spec.confidence_threshold
                confident = threshold is None or float(torch.softmax(logits[j][-1], -1)[token]) >= threshold
                if len(spec.drafts) < count and token not in self.eos_token_ids and confident:
                    inputs[i] = RowInput(inputs[i].slot, position, [token], 0)
                    still.append(i)
                if assistant is not None:
                    spec.assistant_cached = position
            active = still

    def rollback(self, row: Row, history_length: int) -> None:
        """After verification: the assistant keeps only K/V of tokens that are still history."""
        spec = row.speculation
        spec.assistant_cached = min(spec.assistant_cached, history_length)

    def release(self, request: Request) -> None:
        for row in request.rows:
            spec = row.speculation
            if spec is not None and spec.assistant_slot is not None:
                self.assistants[spec.proposer].pool.free(spec.assistant_slot)
                spec.assistant_slot = None


def make_assistant(name: str, model: torch.nn.Module, num_slots: int, max_model_len: int, device: torch.device):  # noqa: ANN201
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
    return Assistant(name, ModelRunner(model, pool, device), pool)
