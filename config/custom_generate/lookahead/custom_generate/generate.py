"""Two-step lookahead greedy decoding: pick the token whose best continuation is most likely.

Greedy search commits to the single most likely next token; beam search keeps several partial
sequences. This method does neither: at every step it takes the ``lookahead_top_k`` most likely
next tokens, looks one token further for each, and commits the candidate ``c`` maximising
``log p(c | x) + max_t log p(t | x, c)`` (only ``c``; the look-ahead token is decided again at
the next step). It avoids a next token that leads nowhere likely. ``lookahead_top_k=1`` is plain
greedy search.

Cost: one forward of ``lookahead_top_k`` rows of one token per generated token. The look-ahead
forward of the chosen candidate is the next step's forward too: the KV cache is widened to the
candidates (``batch_repeat_interleave``) and narrowed back to the winner (``batch_select_indices``),
so the committed token is never recomputed.
"""

import torch


def generate(
    model, input_ids, generation_config=None, lookahead_top_k=4, streamer=None, stopping_criteria=None, **kwargs
):
    """Greedy decoding that scores each of the top `lookahead_top_k` next tokens by its best continuation."""
    if not isinstance(lookahead_top_k, int) or isinstance(lookahead_top_k, bool) or not 1 <= lookahead_top_k <= 64:
        raise ValueError(f"lookahead_top_k must be an integer in [1, 64], got {lookahead_top_k!r}")
    if input_ids.shape[0] != 1:
        raise ValueError("lookahead decoding takes one prompt at a time")
    config = generation_config or model.generation_config
    max_new_tokens = config.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = config.max_length - input_ids.shape[1]
    eos = config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])

    if streamer is not None:
        streamer.put(input_ids.cpu())
    out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
    cache, scores = out.past_key_values, out.logits[:, -1, :].float()  # [1, vocab]
    sequence = input_ids
    for _ in range(max_new_tokens):
        first, candidates = torch.log_softmax(scores, dim=-1)[0].topk(lookahead_top_k)  # [k], [k]
        cache.batch_repeat_interleave(lookahead_top_k)
        out = model(input_ids=candidates[:, None], past_key_values=cache, use_cache=True)
        ahead = out.logits[:, -1, :].float()  # [k, vocab]: each candidate's next-token scores
        best = (first + torch.log_softmax(ahead, dim=-1).max(dim=-1).values).argmax()
        cache = out.past_key_values
        cache.batch_select_indices(best.view(1))
        token = candidates[best].view(1, 1).to(sequence.dtype)
        sequence = torch.cat([sequence, token], dim=1)
        if streamer is not None:
            streamer.put(token[0].cpu())
        if token.item() in eos:
            break
        if stopping_criteria is not None and bool(stopping_criteria(sequence, scores).all()):
            break
        scores = ahead[best].view(1, -1)
    if streamer is not None:
        streamer.end()
    return sequence
