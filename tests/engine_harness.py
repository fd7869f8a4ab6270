"""Drive an Engine synchronously, without the worker thread or HTTP, for engine-level tests."""

from __future__ import annotations

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from decoding.engine.core import Engine
from decoding.engine.limits import EngineLimits
from decoding.model.attention import register_attention
from decoding.model.packed_linear import pack_linears
from decoding.model.vision_tower import takes_images, vision_attention
from decoding.outputs import RequestOutput
from decoding.params import GenerationParams


def tiny_llama(vocab_size: int, seed: int = 0, num_layers: int = 2) -> LlamaForCausalLM:
    """A random Llama small enough to run in milliseconds; GQA like SmolLM2 (heads 4, kv 2)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


def as_served(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` (its own config object) as the server runs it: Decoda's attention and
    weight layout."""
    ours = copy.deepcopy(model)
    attention = register_attention()
    ours.set_attn_implementation(vision_attention(attention, ours.config) if takes_images(ours.config) else attention)
    pack_linears(ours)
    return ours


class EngineHarness:
    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: object,
        eos_token_ids: list[int],
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 512,
        max_model_len: int = 256,
        served: bool = False,
        device: torch.device | str = "cpu",
        **kv_cache: object,
    ) -> None:
        """``kv_cache``: EngineLimits' KV settings (kv_cache_blocks, block_size, prefix_caching).
        ``served``: ``model`` already is ``as_served`` (a test reusing one copy for many engines).
        ``device``: where the engine runs (the model must already be there: tests/gpu)."""
        self.outputs: dict[str, list[RequestOutput]] = {}
        limits = EngineLimits(max_model_len, max_num_seqs, max_num_batched_tokens, **kv_cache)
        served_model = model if served else as_served(model)
        self.engine = Engine(served_model, tokenizer, eos_token_ids, limits, self._collect, torch.device(device))

    def _collect(self, output: RequestOutput) -> None:
        self.outputs.setdefault(output.request_id, []).append(output)

    def add(self, request_id: str, prompt_ids: list[int], params: GenerationParams, **inputs: object) -> None:
        """``inputs``: the request's other inputs (``image_prompt``, ``encoder_input``)."""
        self.engine.add_request(request_id, prompt_ids, params, **inputs)

    def run(self, max_steps: int = 10_000) -> None:
        with torch.inference_mode():
            for _ in range(max_steps):
                if not self.engine.has_work():
                    return
                self.engine.step()
        raise AssertionError("engine did not finish")

    def token_ids(self, request_id: str, index: int = 0) -> list[int]:
        return [t for out in self.outputs[request_id] for d in out.deltas if d.index == index for t in d.token_ids]

    def text(self, request_id: str, index: int = 0) -> str:
        return "".join(d.text for out in self.outputs[request_id] for d in out.deltas if d.index == index)

    def sequence_scores(self, request_id: str) -> list[float]:
        """Beam scores of the returned choices, in choice order (sent with logprobs)."""
        return [
            d.sequence_score
            for out in self.outputs[request_id]
            for d in sorted(out.deltas, key=lambda d: d.index)
            if d.sequence_score is not None
        ]

    def finish_reason(self, request_id: str, index: int = 0) -> str | None:
        reasons = [d.finish_reason for out in self.outputs[request_id] for d in out.deltas if d.index == index]
        reasons = [r for r in reasons if r is not None]
        return reasons[-1].value if reasons else None


def hf_greedy(model: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int, **kwargs: object) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids], device=model.device),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long, device=model.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            **kwargs,
        )
    return out[0, len(prompt_ids) :].tolist()
