"""GIT (``GitForCausalLM``) on Decoda's paged attention: its own forward, since its model puts the image before
the text itself and computes its text attention in the module.

``GitSelfAttention`` is transformers' eager attention written out in the module (GIT has no other implementation
and never calls ``AttentionInterface``), and ``GitModel`` concatenates the image's features before the text's
embeddings inside its forward. So, as ``seq2seq`` marks the modules whose attention is not plain:

- ``route_attention`` turns each layer's ``GitSelfAttention`` into ``PagedGitSelfAttention`` (a subclass, so it
  survives copies): with a step layout its forward projects q, k and v with the module's own linears and calls
  Decoda's attention function, as ``attn_implementation="decoda"`` does in the other families; without one
  (transformers' own forward: the load check's reference, ``generate()``) it is GIT's own.
- ``git_logits`` is the runner's forward: the text embeddings (word + learned position, LayerNorm) at each
  token's text position (its row position less its image's positions, ``RowMedia.text_start``: ``generate()``
  numbers the text from 0), the image features written over the image positions' hidden states (they get neither
  the position embedding nor the LayerNorm: ``GitModel`` concatenates them after both), the layers with the
  layout, then the LM head at the kept positions only.
- ``git_image_features``: what ``GitModel`` computes from ``pixel_values`` (the image encoder's last hidden
  state, projected), which the vision stage runs once per prompt.
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.git.modeling_git import GitSelfAttention

from decoding.model.attention import ATTENTION_NAME, LAYOUT_KWARG, StepLayout

Images = list[tuple[int, tuple[torch.Tensor, torch.Tensor]]]  # (a row's packed offset, (its offsets, features))


class PagedGitSelfAttention(GitSelfAttention):
    """GIT's self-attention reading and writing the paged KV cache when the runner passes a step layout."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: object = None,
        **kwargs: object,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if kwargs.get(LAYOUT_KWARG) is None:
            return super().forward(hidden_states, attention_mask, past_key_values, **kwargs)
        shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
        query = self.query(hidden_states).view(shape).transpose(1, 2)  # [1, heads, tokens, head_dim]
        key = self.key(hidden_states).view(shape).transpose(1, 2)
        value = self.value(hidden_states).view(shape).transpose(1, 2)
        attend = ALL_ATTENTION_FUNCTIONS[ATTENTION_NAME]  # looked up per call: the load check counts its calls
        out, _ = attend(self, query, key, value, None, scaling=self.attention_head_size**-0.5, **kwargs)
        return out.reshape(*hidden_states.shape[:-1], self.all_head_size), None


def route_attention(model: torch.nn.Module) -> None:
    """Make every layer's self-attention take Decoda's paged attention when given a layout; idempotent."""
    for layer in model.git.encoder.layer:
        module = layer.attention.self
        if type(module) is GitSelfAttention:
            module.__class__ = PagedGitSelfAttention


def routed(model: torch.nn.Module) -> bool:
    return all(isinstance(layer.attention.self, PagedGitSelfAttention) for layer in model.git.encoder.layer)


def text_positions(layout: StepLayout) -> torch.Tensor:
    """``[num_tokens]`` each packed token's text position: its row position less the row's image positions
    (clamped at 0 on the image positions themselves, whose embeddings the features replace)."""
    media = layout.pool.media
    shifts = [0 if media[seg.slot] is None else media[seg.slot].text_start for seg in layout.segments]
    if not any(shifts):
        return layout.token_positions
    device = layout.token_positions.device
    lengths = torch.tensor([seg.length for seg in layout.segments], dtype=torch.long, device=device)
    shift = torch.repeat_interleave(torch.tensor(shifts, dtype=torch.long, device=device), lengths)
    return (layout.token_positions - shift).clamp_(min=0)


def git_logits(model: torch.nn.Module, input_ids: torch.Tensor, keep: torch.Tensor, layout: StepLayout,
               images: Images) -> torch.Tensor:  # fmt: skip
    """``[1, kept, vocab]``: GIT's forward over the packed rows (``input_ids`` ``[1, num_tokens]``)."""
    git = model.git
    hidden = git.embeddings(input_ids=input_ids, position_ids=text_positions(layout).unsqueeze(0))
    if images:
        where = torch.cat([offsets + start for start, (offsets, _) in images])
        hidden[0, where] = torch.cat([features for _, (_, features) in images]).to(hidden.dtype)
    for layer in git.encoder.layer:
        hidden = layer(hidden, None, None, **{LAYOUT_KWARG: layout})
    return model.output(hidden[:, keep])


def git_image_features(model: torch.nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """``[images * tokens, hidden]``: the projected image encoder output of each image in ``pixel_values``
    ``[images, 3, H, W]``, as ``GitModel`` puts it before the text."""
    if pixel_values.dim() != 4:
        raise ValueError(f"GIT takes images as pixel_values [images, 3, H, W], not {tuple(pixel_values.shape)}")
    git = model.git
    features = git.visual_projection(git.image_encoder(pixel_values).last_hidden_state)
    return features.reshape(-1, features.shape[-1])
