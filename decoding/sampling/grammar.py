"""One row's place in its constraint, and the mask stage that keeps its next token inside it.

Each row holds its own llguidance matcher (``RowGrammar``), copied from the request's compiled
grammar: rows of ``n``, beams (forked and reordered with them: ``RowSamplingState.fork``) and the
positions a verification walks through all advance their own. The mask is computed for a row's
current state whenever its scores are processed, so a speculative verification, which commits its
positions one by one, masks each position after the tokens before it, and a rejected draft never
reaches the matcher (nothing to roll back).

Where the mask sits: ``SamplingBatch.process`` applies it after the penalties and bans and before
the warpers, at HF's ``PrefixConstrainedLogitsProcessor`` position (``prefix_allowed_tokens_fn``,
HF's own constrained decoding): top-k, top-p and the rest then see only allowed tokens, as vLLM's
grammar bitmask does for its sampler. A banned token is -inf, as every ban is.
"""

from __future__ import annotations

import torch
from llguidance import LLMatcher

_BITS = 32


class RowGrammar:
    def __init__(self, matcher: LLMatcher, eos_token_ids: list[int]) -> None:
        self.matcher = matcher
        self.eos_token_ids = list(eos_token_ids)
        self.broken = False  # a token outside the grammar was appended (a -inf beam candidate)

    def fork(self) -> RowGrammar:
        twin = RowGrammar(self.matcher.deep_copy(), self.eos_token_ids)
        twin.broken = self.broken
        return twin

    def append(self, token: int) -> None:
        if not self.broken and not self.matcher.consume_token(token):
            self.broken = True

    @property
    def done(self) -> bool:
        """The constraint is complete and nothing may follow (an open one, such as ``a+``, is not)."""
        return not self.broken and self.matcher.is_stopped()

    def fill(self, words: torch.Tensor) -> None:
        """Write the allowed-token bitmask (``[ceil(vocab / 32)]`` int32, on the CPU) into ``words``."""
        if self.broken or self.matcher.is_error():
            words.zero_()  # only eos, below: the row cannot continue inside the grammar
            for token in self.eos_token_ids:
                words[token // _BITS] |= 1 << (token % _BITS)
            return
        self.matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())


def apply_grammar_masks(scores: torch.Tensor, rows: list[int], grammars: list[RowGrammar]) -> None:
    """Ban, in ``scores`` (``[num_rows, vocab_size]``), every token each row's grammar does not allow next."""
    vocab_size = scores.shape[1]
    # on the CPU whatever the engine's device: llguidance writes the bits through a host pointer
    words = torch.zeros((len(rows), (vocab_size + _BITS - 1) // _BITS), dtype=torch.int32, device="cpu")
    for i, grammar in enumerate(grammars):
        grammar.fill(words[i])
    shifts = torch.arange(_BITS, dtype=torch.int32, device="cpu")
    allowed = ((words[:, :, None] >> shifts) & 1).reshape(len(rows), -1)[:, :vocab_size].bool()  # [n, vocab]
    index = torch.tensor(rows, dtype=torch.long, device=scores.device)
    scores[index] = scores[index].masked_fill(~allowed.to(scores.device), float("-inf"))
