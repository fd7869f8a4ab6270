"""Model-free building blocks of speculative decoding: where drafts come from and how many.

``prompt_lookup`` drafts from the text itself, ``draft_schedule`` decides the draft length per step
(HF's schedules plus Decoda's back-off), ``token_alignment`` moves ids between two tokenizers for
universal assisted decoding. Verification lives in ``decoding.sampling.speculative``. Nothing here
runs a model or knows the engine; the engine wires these into its batched step.
"""

from decoding.proposers.draft_schedule import BackoffPolicy, DraftSchedule, should_stop_drafting
from decoding.proposers.prompt_lookup import propose_prompt_lookup
from decoding.proposers.token_alignment import UniversalAligner, retokenize

__all__ = [
    "BackoffPolicy",
    "DraftSchedule",
    "UniversalAligner",
    "propose_prompt_lookup",
    "retokenize",
    "should_stop_drafting",
]
