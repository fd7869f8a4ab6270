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

Two ways a constraint can fail mid-generation, and neither may pass for a normal end: the matcher
reaches its error state (a limit of llguidance's, or a state the grammar cannot continue from), or
the request's masks cost too much CPU work. An ambiguous grammar (``s: s s | "a"``) compiles in a
millisecond and then grows each row's mask with every token (4 ms at token 200, 440 ms at 900),
which would slow every step of every request in the batch; each request's rows share a
``MaskBudget``, and a request whose masks average more than ``MEAN_CALL_LIMIT_S`` per call over its
last ``WINDOW_CALLS`` (or one row's mask more than ``ROW_LIMIT_S``) fails with ``GrammarFailure``,
which the engine reports to that client as a 400 naming the constraint (an SSE error event when
streaming), logs and counts (``decoda_structured_output_failures_total``). Masks are computed row
after row on the worker thread: llguidance's parallel ``fill_next_token_bitmask_par`` measured no
faster on two cores (16 JSON-schema rows 0.51 ms against 0.20 ms; 16 ambiguous rows 62 against
49 ms) and would hide which request spent the time.

What the budget counts is the worker thread's own CPU time inside llguidance's mask call
(``time.thread_time``: ``LLMatcher.unsafe_compute_mask_ptr`` computes on the calling thread, with the
GIL released), not wall-clock time: on a busy machine the wall clock also counts the time the thread
waited for a core (other processes, torch's own threads) and for the GIL to come back from the event
loop (up to the 5 ms switch interval per call), which once made a ``{name, age}`` schema, whose masks
cost tens of microseconds, look "too ambiguous". llguidance's deterministic fuel limits (``LIMITS``:
``step_max_items``, ``step_lexer_fuel``) cannot say it instead: the ambiguous grammar's cost grows in
the parser's work over earlier rows, not in the items it adds per mask (a 2,000-item limit stops it
only at token ~250, at ~20 ms a mask).

The limits are stated for a vocabulary of up to ``LIMIT_VOCAB`` tokens (SmolLM2's 49,152) and grow in
proportion past it: a mask walks the tokens its state allows, so an open state (free text before a lazy
tool-call trigger, a JSON string) costs in proportion to the vocabulary. Qwen2.5's 151,936 tokens took
6.4 ms a step for an ordinary tool call's grammar on a 2-core Xeon, over a flat 5 ms: a plain
``get_stock_price`` call was refused as "too ambiguous". The ambiguous grammar's cost still grows without
bound and is caught a few dozen tokens later.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch
from llguidance import LLMatcher

from decoding.params import GenerationParams

_BITS = 32
# CPU seconds of the worker thread (time.thread_time), never wall-clock seconds, for a vocabulary of up to
# LIMIT_VOCAB tokens; a larger one's limits grow in proportion (``limit_for``)
ROW_LIMIT_S = 0.05  # one row's one mask: far past any schema's (tens of microseconds to a few ms)
MEAN_CALL_LIMIT_S = 0.005  # a request's masks per call (all its rows), averaged over its last calls
LIMIT_VOCAB = 50_000
WINDOW_CALLS = 8  # calls the average is taken over (none counts before that many)
# [256, 8]: a bitmask byte's value -> its 8 tokens' penalties (bit j set: token j allowed, 0; else -inf);
# on the CPU, where llguidance writes the bitmask: the gathered penalties move to the scores' device after
_BYTE_PENALTIES = torch.tensor(
    [[0.0 if (byte >> j) & 1 else float("-inf") for j in range(8)] for byte in range(256)], device="cpu"
)


class GrammarFailure(ValueError):
    """A request's constraint cannot go on: its matcher errored, or its masks are over budget."""

    def __init__(self, message: str, budget: MaskBudget, reason: str) -> None:
        super().__init__(message)
        self.budget = budget
        self.reason = reason  # "error" or "budget": the metric's label


@dataclass
class MaskBudget:
    """The mask CPU time one request spends, over all its rows, call by call; shared by its rows' grammars
    (forks included), so ``n`` rows or beams of one request are charged together. What counts is the
    average of its last ``WINDOW_CALLS`` calls: a mask's cost that keeps growing (an ambiguous grammar:
    quadratically with the tokens) is caught as soon as it stays high, a one-off spike (a first mask
    that builds lexer states) is forgiven."""

    param: str = "structured_outputs"  # the field the constraint came from, for the error
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW_CALLS))

    def charge(self, seconds: float, vocab_size: int = LIMIT_VOCAB) -> None:
        """Add one call's mask CPU time (all of this request's rows in it, masks over ``vocab_size`` tokens);
        raise when over budget."""
        self.recent.append(seconds)
        mean = sum(self.recent) / len(self.recent)
        limit = limit_for(MEAN_CALL_LIMIT_S, vocab_size)
        if len(self.recent) == WINDOW_CALLS and mean > limit:
            raise GrammarFailure(
                f"{self.param}: the constraint took {mean * 1e3:.1f} ms of CPU per step to check over its last "
                f"{WINDOW_CALLS} steps (at most {limit * 1e3:.3g} ms): it is too ambiguous to serve; simplify it",
                self, "budget",
            )  # fmt: skip


def limit_for(limit_s: float, vocab_size: int) -> float:
    """A CPU limit stated for ``LIMIT_VOCAB`` tokens, for masks over ``vocab_size`` tokens."""
    return limit_s * max(1.0, vocab_size / LIMIT_VOCAB)


def mask_budget_of(params: GenerationParams) -> MaskBudget | None:
    """A fresh budget for a request with a constraint (None without one)."""
    if params.compiled_grammar is None:
        return None
    return MaskBudget(params.structured_output.param if params.structured_output else "structured_outputs")


class RowGrammar:
    def __init__(self, matcher: LLMatcher, eos_token_ids: list[int], budget: MaskBudget | None = None) -> None:
        self.matcher = matcher
        self.eos_token_ids = list(eos_token_ids)
        self.budget = budget if budget is not None else MaskBudget()
        self.broken = False  # a token outside the grammar was appended (a -inf beam candidate)

    def fork(self) -> RowGrammar:
        twin = RowGrammar(self.matcher.deep_copy(), self.eos_token_ids, self.budget)
        twin.broken = self.broken
        return twin

    def append(self, token: int) -> None:
        if not self.broken and not self.matcher.consume_token(token):
            self.broken = True

    @property
    def done(self) -> bool:
        """The constraint is complete and nothing may follow (an open one, such as ``a+``, is not)."""
        return not self.broken and self.matcher.is_stopped()

    def fill(self, words: torch.Tensor) -> float:
        """Write the allowed-token bitmask (``[ceil(vocab / 32)]`` int32, on the CPU) into ``words``;
        the CPU seconds it took this thread. A matcher in its error state is a ``GrammarFailure``, never
        a quiet eos."""
        if self.broken:
            words.zero_()  # only eos, below: a beam candidate outside the grammar, scored -inf, ends
            for token in self.eos_token_ids:
                words[token // _BITS] |= 1 << (token % _BITS)
            return 0.0
        if self.matcher.is_error():
            reason = " ".join(self.matcher.get_error().split())[:300]
            message = f"{self.budget.param}: the constraint cannot continue: {reason}"
            raise GrammarFailure(message, self.budget, "error")
        started = time.thread_time()
        self.matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())
        seconds = time.thread_time() - started
        limit = limit_for(ROW_LIMIT_S, words.numel() * _BITS)
        if seconds > limit:
            message = (f"{self.budget.param}: one step of the constraint took {seconds * 1e3:.0f} ms of CPU to check "
                       f"(at most {limit * 1e3:.3g} ms); simplify it")  # fmt: skip
            raise GrammarFailure(message, self.budget, "budget")
        return seconds


def apply_grammar_masks(scores: torch.Tensor, rows: list[int], grammars: list[RowGrammar]) -> None:
    """Ban, in ``scores`` (``[num_rows, vocab_size]``), every token each row's grammar does not allow next;
    each request's mask CPU time is charged to its budget."""
    vocab_size = scores.shape[1]
    # on the CPU whatever the engine's device: llguidance writes the bits through a host pointer
    words = torch.zeros((len(rows), (vocab_size + _BITS - 1) // _BITS), dtype=torch.int32, device="cpu")
    spent: dict[int, tuple[MaskBudget, float]] = {}
    for i, grammar in enumerate(grammars):
        seconds = grammar.fill(words[i])
        budget, total = spent.get(id(grammar.budget), (grammar.budget, 0.0))
        spent[id(budget)] = (budget, total + seconds)
    for budget, total in spent.values():
        budget.charge(total, vocab_size)
    # each byte of the bitmask (little-endian words: byte b holds tokens 8b..8b+7) looks up its 8 penalties,
    # 0 where allowed and -inf where banned: one gather, ~3x faster than unpacking the bits with shifts
    # (210 rows of 49k: ~55 ms against ~170 on a busy 2-core machine). Adding the penalty is ~4x faster
    # on the CPU than masked_fill with a bool mask (16 rows of 49k: 1.3 ms against 4.9,
    # loadtests/bench_structured measures the step)
    codes = words.view(torch.uint8).reshape(-1).int()
    penalty = _BYTE_PENALTIES.index_select(0, codes).reshape(len(rows), -1)[:, :vocab_size]
    penalty = penalty.to(device=scores.device, dtype=scores.dtype)
    if rows == list(range(scores.shape[0])):
        scores.add_(penalty)
    else:
        scores.index_add_(0, torch.tensor(rows, dtype=torch.long, device=scores.device), penalty)
