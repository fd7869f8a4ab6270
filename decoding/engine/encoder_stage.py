"""The encoder stage: the requests an encoder-decoder engine admitted this step, encoded together.

Each admitted request's encoder input (Bart's and Marian's prompt tokens, Whisper's log-mel features)
runs through the encoder once, all of this step's in one batch, before the decoder's first forward;
each decoder layer's cross-attention keys and values are computed from the output once and written into
the request's cross slot (``engine/cross_slots.py``), where its rows read them until it ends. A batch
that fails is retried request by request, so one bad input fails only its own request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from decoding.kv.pool import KVPool
from decoding.model.encoder_layout import keep_encoder_stream_row_major
from decoding.model.seq2seq import (
    EncoderInput,
    cross_attention_modules,
    cross_keys_values,
    decoder_start_ids,
    encode,
    encoder_length,
    mark_cross_attention,
)
from decoding.state.request import Request

logger = logging.getLogger(__name__)


class EncoderStage:
    def __init__(self, model: torch.nn.Module, pool: KVPool, device: torch.device) -> None:
        self.model = model
        self.pool = pool
        self.device = device
        self.cross_modules = cross_attention_modules(model)
        mark_cross_attention(model)  # the attention function reads these layers' keys and values from the pool
        keep_encoder_stream_row_major(model)
        self.decoder_prompt = decoder_start_ids(model)  # where a text request's decoder starts

    def inputs(self, prompt_ids: list[int], encoder_input: EncoderInput | None) -> tuple[list[int], EncoderInput]:
        """A request's decoder prompt and encoder input: given both (Whisper's features and its prompt),
        or a text prompt, which the encoder reads while the decoder starts from its start token, as
        ``generate()`` does."""
        if encoder_input is not None:
            return prompt_ids, encoder_input
        return self.decoder_prompt, EncoderInput(token_ids=list(prompt_ids))

    def attach(self, request: Request, encoder_input: EncoderInput) -> None:
        """Give a new request its encoder input; the scheduler reserves its cross slot by its length."""
        request.encoder_input = encoder_input
        request.encoder_length = encoder_length(self.model, encoder_input)

    @torch.inference_mode()
    def run(self, requests: list[Request], fail: Callable[[Request, str], None]) -> None:
        """Encode ``requests`` (each holds its cross slot) and fill their cross slots; ``fail`` ends one
        whose input the encoder cannot take."""
        if not requests:
            return
        try:
            self._encode(requests)
        except Exception:
            if len(requests) == 1:
                logger.exception("encoding request %s failed", requests[0].request_id)
                fail(requests[0], "the encoder failed on this input")
                return
            for request in requests:  # find who broke the batch
                self.run([request], fail)

    def _encode(self, requests: list[Request]) -> None:
        hidden = encode(self.model, [request.encoder_input for request in requests], self.device)
        for request, states in zip(requests, hidden, strict=True):
            for layer, module in enumerate(self.cross_modules):
                keys, values = cross_keys_values(module, states)
                self.pool.write(request.cross_slot, layer, keys, values)
            request.encoded = True
