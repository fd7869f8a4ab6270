"""What every strategy of one engine shares: the model's facts and the engine's services.

One ``EngineContext`` per engine, built from the model once and handed to each request's strategy
(and to ``Request.create``), so no strategy reaches into the engine for a fact or a service: the
KV pool, the LM head (contrastive search and DoLa read hidden states through it), the token-text
function for logprobs, the observer that counts for metrics, and a decode step's measured cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from decoding.kv.pool import KVPool
from decoding.sampling.logprobs import TokenText
from decoding.telemetry import EngineObserver


@dataclass
class EngineContext:
    """The facts and shared services a strategy may use; one per engine."""

    device: torch.device
    pool: KVPool
    num_layers: int
    vocab_size: int
    eos_token_ids: list[int]  # in the model's order: HF pads with the first
    pad_token_id: int
    max_model_len: int
    lm_head: torch.nn.Module
    tied_embeddings: bool
    token_text: TokenText
    observer: EngineObserver = field(default_factory=EngineObserver)
    step_seconds: float | None = None  # a decode forward's cost, the unit drafting time is weighed in

    @classmethod
    def for_model(
        cls,
        model: torch.nn.Module,
        pool: KVPool,
        eos_token_ids: list[int],
        max_model_len: int,
        token_text: TokenText,
        observer: EngineObserver,
    ) -> EngineContext:
        config = model.config.get_text_config()
        pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
        if isinstance(pad, list):
            pad = pad[0] if pad else None
        if pad is None:  # HF pads with the first eos token
            pad = eos_token_ids[0] if eos_token_ids else 0
        return cls(
            device=pool.keys[0].device,
            pool=pool,
            num_layers=config.num_hidden_layers,
            vocab_size=config.vocab_size,
            eos_token_ids=list(eos_token_ids),
            pad_token_id=pad,
            max_model_len=max_model_len,
            lm_head=model.get_output_embeddings(),
            tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            token_text=token_text,
            observer=observer,
        )
