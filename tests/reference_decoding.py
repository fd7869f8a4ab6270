"""Contrastive search and DoLa as transformers 4.x ran them, recomputed from full forwards.

transformers 5 dropped both from ``generate()``; the engine's versions are pinned to 4.x's by the
golden files of ``tests/test_engine_hf4_golden.py`` (on Llama). For every other family the matrix
compares against these: each step is one forward of the whole sequence through transformers' own
modeling code and attention (no cache), so what they check per family is everything the engine does
differently (paged K/V, packed rows, hidden states captured by hooks, candidates sharing a prefix).
The step math is 4.x's: ``_ranking_fast`` for contrastive search; for DoLa the contrast itself is
the engine's ``dola_contrast`` (the golden files prove it equals ``_dola_select_contrast``).
"""

from __future__ import annotations

import torch

from decoding.strategies.dola import dola_candidate_layers, dola_contrast


def _forward(
    model: torch.nn.Module, ids: list[int], encoder_inputs: dict | None = None
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The last position's logits and every layer's hidden states; ``encoder_inputs``: an encoder-decoder
    model's encoder input (``input_ids`` or ``input_features``), with ``ids`` its decoder's sequence."""
    ids_tensor = torch.tensor([ids], device=model.device)
    if encoder_inputs is not None:
        out = model(**encoder_inputs, decoder_input_ids=ids_tensor, output_hidden_states=True, use_cache=False)
        return out.logits[0, -1].float(), out.decoder_hidden_states
    out = model(ids_tensor, output_hidden_states=True, use_cache=False)
    return out.logits[0, -1].float(), out.hidden_states


@torch.inference_mode()
def contrastive_search(
    model: torch.nn.Module, prompt: list[int], top_k: int, penalty_alpha: float, max_new_tokens: int, eos: int,
    encoder_inputs: dict | None = None,
) -> list[int]:
    """4.x ``_contrastive_search`` at batch size 1 with no logits processors (``encoder_inputs``: an
    encoder-decoder model's, with ``prompt`` its decoder prompt)."""
    ids = list(prompt)
    logits, hidden = _forward(model, ids, encoder_inputs)
    context = hidden[-1][0]  # [length, hidden]: the last (normed) hidden state of every token so far
    new: list[int] = []
    for _ in range(max_new_tokens):
        probs = torch.softmax(logits, dim=-1)
        top_probs, top_ids = probs.topk(top_k)
        scores, states, next_logits = [], [], []
        for probability, candidate in zip(top_probs.tolist(), top_ids.tolist(), strict=True):
            candidate_logits, candidate_hidden = _forward(model, ids + [candidate], encoder_inputs)
            state = candidate_hidden[-1][0, -1]
            similarity = (context / context.norm(dim=-1, keepdim=True)) @ (state / state.norm())
            scores.append((1.0 - penalty_alpha) * probability - penalty_alpha * float(similarity.max()))
            states.append(state)
            next_logits.append(candidate_logits)
        best = max(range(top_k), key=lambda i: (scores[i], -i))  # the first of equal scores, as torch.max
        token = top_ids[best].item()
        ids.append(token)
        new.append(token)
        context = torch.cat([context, states[best][None]])
        logits = next_logits[best]
        if token == eos:
            break
    return new


@torch.inference_mode()
def dola(
    model: torch.nn.Module, prompt: list[int], dola_layers: str | list[int], max_new_tokens: int, eos: int
) -> list[int]:
    """4.x ``_dola_decoding``, greedy, at batch size 1 with no logits processors."""
    config = model.config.get_text_config()
    tied = bool(getattr(config, "tie_word_embeddings", False))
    layers = dola_candidate_layers(dola_layers, config.num_hidden_layers, tied)
    head = model.get_output_embeddings()
    ids = list(prompt)
    new: list[int] = []
    for _ in range(max_new_tokens):
        final, hidden = _forward(model, ids)
        premature = {layer: head(hidden[layer][:, -1]).float() for layer in layers}
        token = int(dola_contrast(final[None], premature)[0].argmax())
        ids.append(token)
        new.append(token)
        if token == eos:
            break
    return new
