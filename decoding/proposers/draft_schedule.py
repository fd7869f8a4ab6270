"""How many tokens a request drafts per step: HF's schedule, HF's confidence stop, and a back-off.

HF side (transformers 5.23, ``AssistedCandidateGenerator``):

- ``num_assistant_tokens_schedule``: "constant" keeps ``num_assistant_tokens``; "heuristic" adds 2
  after a round in which every draft was accepted and otherwise subtracts 1 (never below 1);
  "heuristic_transient" is the same rule but starts again from the initial value on every
  ``generate`` call. Plain "heuristic" in HF writes the final value back into the assistant's
  ``generation_config`` so the NEXT call starts from it; a server shares one assistant between
  many users, so here every request starts from its initial value and ``value_to_persist`` tells
  an integrator what HF would carry over, should it want to.
- HF's rule compares the round's ``n_matches`` (after its eos/max_length cropping, so possibly
  fewer than were accepted) with the number of drafts; a round with NO drafts therefore counts as
  "all accepted" and grows the count by 2. ``record`` keeps that.
- ``_calculate_new_tokens`` caps the drafts at ``max_length - cur_len - 1`` (the target adds one
  token of its own); see ``DraftSchedule.next_num_tokens``.
- ``assistant_confidence_threshold`` (HF's ``ConfidenceCriteria``, after Mamou et al. 2024,
  "Dynamic Speculation Lookahead"): the assistant stops drafting right after a draft whose
  probability under its own processed distribution is below the threshold; that doubtful draft is
  still proposed. See ``should_stop_drafting``. HF additionally re-fits the threshold from a ROC
  curve when scikit-learn is installed (same-tokenizer assistants only); that adaptation is not
  reproduced here (and scikit-learn is not installed in this project, so HF's threshold is static
  here as well).

Decoda's addition, ``BackoffPolicy``: drafting that keeps failing costs real time (drafting, and
verifying drafts that are thrown away), so a request whose acceptance stays low stops drafting for a
while and probes again later, with exponentially longer pauses while the probes keep failing. It
counts tokens only, never wall-clock time, so the same request always takes the same decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SCHEDULES = ("constant", "heuristic", "heuristic_transient")


def should_stop_drafting(draft_probs: torch.Tensor, token_id: int, threshold: float | None) -> bool:
    """HF's ``ConfidenceCriteria``: stop drafting after ``token_id`` when the drafter gave it less than
    ``threshold``.

    ``draft_probs``: ``[vocab_size]``, softmax of the drafter's processed scores at the position
    that produced ``token_id``. The draft itself is kept: the check runs after a token is appended,
    exactly like HF's stopping criterion. HF only installs the criterion for a threshold that is
    set and > 0; so does this (``None`` or ``<= 0`` never stops). HF's default for an assistant is
    0.4 (``GenerationConfig`` global defaults), read from the ASSISTANT's generation config.
    """
    if threshold is None or threshold <= 0:
        return False
    return float(draft_probs[token_id]) < threshold


@dataclass(frozen=True)
class BackoffPolicy:
    """When a request stops drafting, and for how long. It counts rounds and tokens only, never
    time, so the same outcomes always give the same decisions.

    Cost model: one draft token costs ``draft_token_cost`` target steps on top of the round's own
    target step (running the drafter for it plus verifying it in a wider forward: a few % for
    prompt lookup on a GPU, more on a CPU, roughly the parameter ratio for a draft model). A round
    of k drafts with a accepted emits a + 1 tokens for 1 + k * cost steps where plain greedy emits
    one token per step: it wastes ``k * cost - a`` steps when that is positive, and gains when its
    acceptance rate a / k is above the cost. Rounds are judged in blocks, pooled; a block is poor
    when its rate is below ``max(min_acceptance_rate, draft_token_cost)``.

    The machine:

    - ACTIVE: drafting rounds (rounds with at least one draft; paused and empty rounds do not
      count) form consecutive blocks of ``window`` rounds. A poor block PAUSES drafting. Blocks,
      not a sliding window: one decision per block keeps a good request with noisy rounds
      (acceptance runs end at the first rejection) from being paused by one unlucky stretch.
    - PAUSED: ``next_num_tokens`` is 0 for the pause. Pauses double while probes keep failing:
      ``initial_pause``, twice that, ... (the doubling stops at ``max_pause``), and a pause is
      never shorter than ``ceil(waste / max_overhead)`` steps, ``waste`` being what the poor block
      lost (``drafted * cost - accepted``), which keeps that loss under ``max_overhead`` of the
      paused stretch.
    - PROBING: after a pause the next ``probe_window`` drafting rounds form a block of their own:
      poor pauses again (longer), otherwise the request is ACTIVE with the pause length reset.

    Bound: every poor block's waste is followed by a pause at least ``waste / max_overhead``
    steps long, and blocks that are not poor do not waste (their rate is at least the cost), so a
    request costs at most ``max_overhead`` (10 %) more than plain greedy under the cost model,
    except for the waste of one block when the request ends before the pause that follows it.
    """

    min_acceptance_rate: float = 0.1
    draft_token_cost: float = 0.1
    window: int = 8
    probe_window: int = 2
    initial_pause: int = 8
    max_pause: int = 256
    max_overhead: float = 0.1

    def __post_init__(self) -> None:
        if not 0 <= self.min_acceptance_rate <= 1:
            raise ValueError(f"min_acceptance_rate must be in [0, 1], got {self.min_acceptance_rate}")
        if self.draft_token_cost < 0:
            raise ValueError(f"draft_token_cost must be >= 0, got {self.draft_token_cost}")
        if min(self.window, self.probe_window, self.initial_pause) < 1 or self.max_pause < self.initial_pause:
            raise ValueError("window, probe_window and initial_pause must be >= 1, max_pause >= initial_pause")
        if not 0 < self.max_overhead <= 1:
            raise ValueError(f"max_overhead must be in (0, 1], got {self.max_overhead}")

    @property
    def poor_rate(self) -> float:
        """Pooled acceptance rates below this lose time (or are below the configured floor)."""
        return max(self.min_acceptance_rate, self.draft_token_cost)

    def is_poor(self, num_drafted: int, num_accepted: int) -> bool:
        return num_accepted < self.poor_rate * num_drafted

    def pause_for(self, next_pause: int, num_drafted: int, num_accepted: int) -> int:
        """Length of the pause after a poor block: the doubling pause, or longer if the block's
        waste needs it to stay under ``max_overhead``."""
        waste = max(num_drafted * self.draft_token_cost - num_accepted, 0.0)
        return max(min(next_pause, self.max_pause), math.ceil(waste / self.max_overhead - 1e-9))


DEFAULT_BACKOFF = BackoffPolicy()


class DraftSchedule:
    """One request's number of draft tokens per step (HF's schedule + ``BackoffPolicy``).

    Use: ``n = schedule.next_num_tokens(cur_len, max_length)`` before drafting (pure, may be called
    again), draft at most ``n`` tokens, verify, then ``schedule.record(num_drafted, num_accepted)``
    exactly once per step, paused steps included (record ``0, 0`` when nothing was drafted).
    ``backoff=None`` is HF's behaviour exactly.
    """

    def __init__(
        self,
        num_assistant_tokens: int = 20,
        num_assistant_tokens_schedule: str = "constant",
        backoff: BackoffPolicy | None = DEFAULT_BACKOFF,
    ) -> None:
        if num_assistant_tokens_schedule not in SCHEDULES:
            raise ValueError(
                f"num_assistant_tokens_schedule must be one of {', '.join(SCHEDULES)}, "
                f"got {num_assistant_tokens_schedule!r}"
            )
        if num_assistant_tokens < 0:
            raise ValueError(f"num_assistant_tokens must be >= 0, got {num_assistant_tokens}")
        self.initial = int(num_assistant_tokens)
        self.schedule = num_assistant_tokens_schedule
        self.backoff = backoff
        self.num_assistant_tokens = self.initial  # HF's attribute of the same name
        self.num_drafted = 0  # totals over the request, for metrics
        self.num_accepted = 0
        self.num_pauses = 0
        self._block: list[tuple[int, int]] = []  # the current block's (drafted, accepted) rounds
        self._pause_left = 0
        self._next_pause = backoff.initial_pause if backoff else 0
        self._probing = False

    @property
    def paused(self) -> bool:
        return self._pause_left > 0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted over the request so far (None before any draft)."""
        return self.num_accepted / self.num_drafted if self.num_drafted else None

    def next_num_tokens(self, cur_len: int | None = None, max_length: int | None = None) -> int:
        """Drafts to propose this step: 0 while paused, else the schedule's count, capped like HF's
        ``_calculate_new_tokens`` at ``max_length - cur_len - 1`` when both are given (``cur_len``:
        prompt + generated so far; the target's own token takes the last position)."""
        if self._pause_left > 0:
            return 0
        count = self.num_assistant_tokens
        if cur_len is not None and max_length is not None:
            count = min(count, max_length - cur_len - 1)
        return max(count, 0)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """The step's outcome: drafts proposed and how many of them the target kept (HF's
        ``n_matches`` after its eos / max_length cropping, i.e. tokens emitted minus one)."""
        if num_drafted < 0 or not 0 <= num_accepted <= max(num_drafted, 0):
            raise ValueError(f"need 0 <= num_accepted <= num_drafted, got {num_accepted}, {num_drafted}")
        if self._pause_left > 0:  # our pause, not an HF round: the schedule does not move
            self._pause_left -= 1
            return
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        if self.schedule != "constant":  # HF's update_candidate_strategy
            if num_accepted == num_drafted:
                self.num_assistant_tokens += 2
            else:
                self.num_assistant_tokens = max(1, self.num_assistant_tokens - 1)
        if self.backoff is not None and num_drafted > 0:
            self._judge(num_drafted, num_accepted)

    def value_to_persist(self) -> int | None:
        """What HF would write back to the assistant's ``generation_config.num_assistant_tokens`` at
        the end of the call ("heuristic" only); None for the other schedules."""
        return self.num_assistant_tokens if self.schedule == "heuristic" else None

    def _judge(self, num_drafted: int, num_accepted: int) -> None:
        policy = self.backoff
        assert policy is not None
        self._block.append((num_drafted, num_accepted))
        if len(self._block) < (policy.probe_window if self._probing else policy.window):
            return
        drafted = sum(d for d, _ in self._block)
        accepted = sum(a for _, a in self._block)
        self._block.clear()
        if policy.is_poor(drafted, accepted):
            self._pause_left = policy.pause_for(self._next_pause, drafted, accepted)
            self._next_pause = min(2 * self._pause_left, policy.max_pause)
            self._probing = True
            self.num_pauses += 1
        else:
            self._probing = False
            self._next_pause = policy.initial_pause
