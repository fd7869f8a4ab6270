"""Greedy decoding after ``left_padding`` pad tokens (the example method of HF's custom_generate docs).

HF's documentation shows a custom ``generate()`` that takes an extra ``left_padding`` argument,
puts that many pad tokens before the prompt (with no attention mask, so the model reads them) and
then decodes greedily. This is our own version of it; unlike the docs' sketch it also honours the
generation config's ``max_new_tokens`` and eos, HF's ``streamer`` (``put()`` the prompt, then each
token, then ``end()``) and ``stopping_criteria``, and it reuses the KV cache between steps.
"""

import torch


def generate(
    model, input_ids, generation_config=None, left_padding=None, pad_token=None, streamer=None,
    stopping_criteria=None, **kwargs,
):
    """Greedy decoding with `left_padding` pad tokens (id `pad_token`, default the model's) before the prompt."""
    config = generation_config or model.generation_config
    if left_padding is not None:
        if not isinstance(left_padding, int) or isinstance(left_padding, bool) or left_padding < 0:
            raise ValueError(f"left_padding must be an integer >= 0, got {left_padding!r}")
        if pad_token is None:
            pad_token = config.pad_token_id if config.pad_token_id is not None else model.config.pad_token_id
        if pad_token is None:
            raise ValueError("left_padding needs a pad token: the model defines none, pass pad_token")
        padding = torch.full((input_ids.shape[0], left_padding), pad_token, dtype=input_ids.dtype,
                             device=input_ids.device)
        sequence = torch.cat([padding, input_ids], dim=1)
    else:
        sequence = input_ids
    max_new_tokens = config.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = config.max_length - input_ids.shape[1]
    eos = config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])

    if streamer is not None:
        streamer.put(input_ids.cpu())
    past, step_input = None, sequence
    for _ in range(max_new_tokens):
        out = model(input_ids=step_input, past_key_values=past, use_cache=True)
        past = out.past_key_values
        scores = out.logits[:, -1, :]
        token = scores.argmax(dim=-1)  # [batch]
        sequence = torch.cat([sequence, token[:, None]], dim=1)
        if streamer is not None:
            streamer.put(token.cpu())
        step_input = token[:, None]
        if all(t in eos for t in token.tolist()):
            break
        if stopping_criteria is not None and bool(stopping_criteria(sequence, scores).all()):
            break
    if streamer is not None:
        streamer.end()
    return sequence
