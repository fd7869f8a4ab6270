"""What one row's sampling needs to remember between steps, kept incrementally.

History-dependent knobs would otherwise rebuild ``[num_rows, seq_len]`` tensors every step.
Instead each row keeps exactly what its knobs read, updated in O(1) per appended token:
a ``[vocab]`` "seen" mask for ``repetition_penalty`` (prompt + output, as HF's
``RepetitionPenaltyLogitsProcessor`` reads ``input_ids``), ``[vocab]`` counts of generated tokens
for OpenAI's presence/frequency penalties, and an n-gram table for ``no_repeat_ngram_size``.
"""

from __future__ import annotations

import torch

from decoding.params import GenerationParams
from decoding.sampling.grammar import MaskBudget, RowGrammar, mask_budget_of
from decoding.sampling.thinking import ThinkingBudget
from decoding.sampling.token_rules import TokenRules


class RowSamplingState:
    def __init__(
        self,
        params: GenerationParams,
        prompt_ids: list[int],
        eos_token_ids: list[int],
        vocab_size: int,
        generator: torch.Generator | None,
        device: torch.device | str = "cpu",
        mask_budget: MaskBudget | None = None,
    ) -> None:
        """``mask_budget``: the request's, shared by all its rows (``sampling.grammar``); one of its own
        when the row is the request's only one, or its first, which its beams fork."""
        self.params = params
        self.device = torch.device(device)
        self.alone: object | None = None  # SamplingBatch.for_row's batch of this row alone, built on first use
        self.watermark_table: torch.Tensor | None = None  # selfhash's fixed table, held for the row's life
        self.eos_token_ids = list(eos_token_ids)
        self.vocab_size = vocab_size
        self.generator = generator
        self.num_generated = 0
        self.history: list[int] = list(prompt_ids)  # prompt + generated, as HF's input_ids
        self.seen: torch.Tensor | None = None  # [vocab_size] bool
        self.counts: torch.Tensor | None = None  # [vocab_size] float32, generated tokens only
        self.ngrams: dict[tuple[int, ...], set[int]] | None = None
        if params.repetition_penalty != 1.0:
            self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=self.device)
            if prompt_ids:
                self.seen[torch.tensor(prompt_ids, dtype=torch.long, device=self.device)] = True
        if params.presence_penalty or params.frequency_penalty:
            self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=self.device)
        lists = (params.logit_bias, params.suppress_tokens, params.begin_suppress_tokens, params.bad_words_ids,
                 params.sequence_bias)  # fmt: skip
        self.rules = TokenRules.of(params, vocab_size, self.device) if any(lists) else None
        compiled = params.compiled_grammar  # decoding.structured.CompiledGrammar
        mask_budget = mask_budget or mask_budget_of(params)
        self.grammar = None if compiled is None else RowGrammar(compiled.new_matcher(), self.eos_token_ids, mask_budget)
        self.thinking = ThinkingBudget.of(params)  # a thinking budget's place (sampling/thinking.py)
        if params.no_repeat_ngram_size > 0:
            self.ngrams = {}
            size = params.no_repeat_ngram_size
            for end in range(size, len(self.history) + 1):
                self._add_ngram(self.history[end - size : end])

    def fork(self) -> RowSamplingState:
        """An independent copy, for a beam that continues from this one (HF reorders input_ids)."""
        twin = object.__new__(RowSamplingState)
        twin.__dict__.update(self.__dict__)
        twin.alone = None
        twin.history = list(self.history)
        twin.seen = None if self.seen is None else self.seen.clone()
        twin.counts = None if self.counts is None else self.counts.clone()
        twin.ngrams = None if self.ngrams is None else {k: set(v) for k, v in self.ngrams.items()}
        twin.grammar = None if self.grammar is None else self.grammar.fork()
        twin.thinking = None if self.thinking is None else self.thinking.fork()
        return twin

    def _add_ngram(self, ngram: list[int]) -> None:
        self.ngrams.setdefault(tuple(ngram[:-1]), set()).add(ngram[-1])

    def append(self, token_id: int) -> None:
        self.num_generated += 1
        self.history.append(token_id)
        if self.seen is not None:
            self.seen[token_id] = True
        if self.counts is not None:
            self.counts[token_id] += 1
        if self.grammar is not None:
            self.grammar.append(token_id)
        if self.thinking is not None:
            self.thinking.append(token_id)
        if self.ngrams is not None and len(self.history) >= self.params.no_repeat_ngram_size:
            self._add_ngram(self.history[-self.params.no_repeat_ngram_size :])

    def banned_ngram_tokens(self) -> set[int]:
        """Tokens that would repeat an n-gram (HF's NoRepeatNGramLogitsProcessor)."""
        size = self.params.no_repeat_ngram_size
        if self.ngrams is None or len(self.history) < size:
            return set()
        prefix = tuple(self.history[len(self.history) + 1 - size :]) if size > 1 else ()
        return self.ngrams.get(prefix, set())

    def banned_bad_words(self) -> set[int]:
        """Last tokens of ``bad_words_ids`` sequences whose prefix ends the history (HF's NoBadWords)."""
        if self.rules is None or not self.params.bad_words_ids:
            return set()
        return self.rules.banned_bad_words(self.history)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A request's own generator: seeded requests reproduce whatever else shares the batch.

    Seeded like ``torch.manual_seed(seed)``, so a batch-1 seeded request draws exactly what HF's
    ``generate(do_sample=True)`` draws after ``torch.manual_seed(seed)``.
    """
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
