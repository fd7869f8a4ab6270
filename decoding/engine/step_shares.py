"""Fair shares of each step, not only of the batch (``--fair-share steps``).

The fair share between callers (``policy.py``) decides who holds the batch's rows: a caller with 4
requests beside another's burst of 64 holds its 4 at once. On a GPU that is the whole answer, since a
step of 68 rows takes about as long as one of 4. On a CPU a step's time grows with its rows (each row
is a matrix-vector product's worth of work), so the small caller's 4 rows run at the pace of a 68-row
step: measured, 0.22x the tokens per second it gets alone, although it held every row it asked for.

``steps`` shares the work of every step instead: when several callers have running requests, each
feeds at most its weight's part of what the least-holding caller feeds, rows per unit of weight
(``floor(w_c * min over callers of rows_c / w_c)``, at least one request). Two callers of weight 1, one
holding 4 rows and one 64: each step feeds the 4 and 4 of the 64, so both callers get the same tokens
per second and the small one's steps are nearly as short as alone. Within a caller, the requests fed
least recently go first, so every held request advances in turn; those that sit a step out keep all
their state (as lower priorities sit out a higher priority's prefill) and go on when their turn comes.

The trade is total throughput: a step of 8 rows makes fewer tokens than one of 68 on the same CPU, so
the engine's tokens per second fall while two callers compete, to protect the smaller one. That is why
``rows`` (share the batch only, vLLM's and the GPU's answer) stays the default, and ``steps`` is the
operator's choice for a CPU serving callers who must not slow each other down. With one caller
nothing changes.
"""

from __future__ import annotations

import math
from collections import defaultdict

from decoding.engine.policy import Shares, caller_of, run_order
from decoding.strategies import DecodingStrategy

FAIR_SHARE_MODES = ("rows", "steps")


class StepShares:
    def __init__(self, shares: Shares, mode: str = "rows") -> None:
        if mode not in FAIR_SHARE_MODES:
            raise ValueError(f"fair share mode must be one of {', '.join(FAIR_SHARE_MODES)}, got {mode!r}")
        self.shares = shares
        self.per_step = mode == "steps"
        # id(strategy) -> when it last fed rows: a count that grows in the order requests take their turns, so
        # within a caller the least recently fed go first (round robin, also among those fed in one step)
        self._last_fed: dict[int, int] = {}
        self._turns = 0
        self._chosen: dict[int, int] = {}  # id(strategy) -> its place in the last selection's order

    def select(self, candidates: list[DecodingStrategy]) -> list[DecodingStrategy]:
        """The requests among ``candidates`` (in run order) that feed this step's rows."""
        if not self.per_step:
            return candidates
        by_caller: dict[str, list[DecodingStrategy]] = defaultdict(list)
        for strategy in candidates:
            by_caller[caller_of(strategy)].append(strategy)
        if len(by_caller) < 2:
            return candidates
        rows_per_weight = min(
            sum(s.num_slots for s in mine) / self.shares.weight(caller) for caller, mine in by_caller.items()
        )
        self._chosen = {}
        for caller, mine in by_caller.items():
            quota = math.floor(rows_per_weight * self.shares.weight(caller) + 1e-9)
            rows = 0
            for strategy in sorted(mine, key=lambda s: (self._last_fed.get(id(s), -1), run_order(s))):
                if rows and rows + strategy.num_slots > quota:
                    break
                self._chosen[id(strategy)] = len(self._chosen)
                rows += strategy.num_slots
        return [strategy for strategy in candidates if id(strategy) in self._chosen]

    def fed(self, strategies: list[DecodingStrategy]) -> None:
        """This step's rows are planned: the requests that feed them had their turn."""
        if not self.per_step:
            return
        for strategy in sorted(strategies, key=lambda s: self._chosen.get(id(s), len(self._chosen))):
            self._turns += 1
            self._last_fed[id(strategy)] = self._turns

    def forget(self, strategy: DecodingStrategy) -> None:
        self._last_fed.pop(id(strategy), None)
