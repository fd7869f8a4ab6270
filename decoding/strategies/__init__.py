"""Decoding strategies, one module each, behind the one interface of ``base.DecodingStrategy``.

``make_strategy`` is the only place that maps HF's strategy resolution (``params.strategy``) to a
class; the engine builds each request's strategy through it and never asks which one it got.
"""

from __future__ import annotations

from decoding.params import Strategy, guidance_active
from decoding.state.context import EngineContext
from decoding.state.request import Request
from decoding.strategies.base import DecodingStrategy, DraftJob, Pick
from decoding.strategies.beam import BeamDecoding
from decoding.strategies.contrastive import ContrastiveDecoding
from decoding.strategies.dola import DolaDecoding
from decoding.strategies.group_beam import GroupBeamDecoding
from decoding.strategies.guidance import GuidanceDecoding
from decoding.strategies.plain import PlainDecoding
from decoding.strategies.speculative import SpeculativeDecoding

STRATEGIES: dict[Strategy, type[DecodingStrategy]] = {
    Strategy.GREEDY: PlainDecoding,
    Strategy.SAMPLE: PlainDecoding,
    Strategy.BEAM: BeamDecoding,
    Strategy.BEAM_SAMPLE: BeamDecoding,
    Strategy.GROUP_BEAM: GroupBeamDecoding,
    Strategy.CONTRASTIVE: ContrastiveDecoding,
    Strategy.DOLA: DolaDecoding,
    Strategy.ASSISTED: SpeculativeDecoding,
}


def make_strategy(request: Request, ctx: EngineContext) -> DecodingStrategy:
    if guidance_active(request.params):  # HF's CFG processor on greedy/sampling (validate allows no other)
        return GuidanceDecoding(request, ctx)
    return STRATEGIES[request.params.strategy](request, ctx)


__all__ = ["DecodingStrategy", "DraftJob", "EngineContext", "Pick", "make_strategy"]
