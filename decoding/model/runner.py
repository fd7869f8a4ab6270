"""One forward for all rows of all requests.

The runner packs every row's new tokens into a single sequence, hands the model a
``StepLayout`` through transformers' attention kwargs (``decoda_layout``: the model passes its
extra kwargs down to the attention function), and asks for logits only at the positions somebody
needs (``logits_to_keep``), so the LM head, the largest matmul of a small model, runs on a
handful of rows instead of every prompt token.

A compiled forward cannot take a Python object as an argument without re-tracing every step, so
under ``torch.compile`` the layout travels beside the call instead (``attention.active_layout``).
A forward that hooks into layers (hidden states for DoLa or contrastive search, early exit) runs
eagerly: a hook inside a compiled graph would be traced into it, and an early exit's exception
cannot leave one.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

import torch

from decoding.kv.pool import KVPool
from decoding.model.anatomy import decoder_layers, final_norm
from decoding.model.attention import LAYOUT_KWARG, Segment, StepLayout, active_layout
from decoding.model.compile import is_compiled
from decoding.model.cuda_graphs import DecodeGraphs, wants_cuda_graphs
from decoding.model.git_forward import git_logits, route_attention
from decoding.model.lora import LoraResidency
from decoding.model.seq2seq import decoder_logits, is_encoder_decoder
from decoding.vision.git_prompt import is_git


class StepInterrupted(Exception):
    """Raised between two decoder layers when ``forward``'s ``interrupt`` says so: the forward is left
    unfinished (the K/V it wrote lie beyond every row's committed length) and may be run again as it was."""


class _ExitReached(Exception):
    """Raised by a hook after the last layer an early-exit forward runs; carries its output."""

    def __init__(self, hidden: torch.Tensor) -> None:
        self.hidden = hidden


@dataclass
class RowInput:
    """What one row feeds this step and which of its positions need logits (and hidden states)."""

    slot: int
    start: int  # tokens already cached for this row
    token_ids: list[int]
    logits_from: int  # logits are returned for token_ids[logits_from:]; len(token_ids) means none
    siblings: bool = False  # the tokens are alternatives at position ``start`` (contrastive search)
    # hidden states wanted, by HF's ``output_hidden_states`` index: 0 the embeddings, i the input of
    # decoder layer i, num_layers the final normed output; filled in by the runner for every token
    hidden_layers: tuple[int, ...] = ()
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [len(token_ids), hidden]
    # a prompt chunk holding image tokens: (their offsets in token_ids, the image features replacing their
    # input embeddings), as a vision-language model's ``masked_scatter`` places them
    image_features: tuple[torch.Tensor, torch.Tensor] | None = None


class ModelRunner:
    def __init__(
        self, model: torch.nn.Module, pool: KVPool, device: torch.device, lora: LoraResidency | None = None
    ) -> None:
        """``lora``: the adapters of a model whose projections are wrapped (``decoding.model.lora``)."""
        self.model = model
        self.lora = lora
        self.pool = pool
        self.device = device
        self.layers = decoder_layers(model)
        self.norm = final_norm(model)
        self.num_layers = len(self.layers)
        self.compiled = is_compiled(model)
        self.seq2seq = is_encoder_decoder(model.config)
        self.git = is_git(model.config)  # GIT puts its image before its text itself: its own forward
        if self.git:
            route_attention(model)
        self.graphs = None  # decode-only steps replayed from CUDA graphs (``--compile`` on a GPU)
        if wants_cuda_graphs(model):
            self.graphs = DecodeGraphs(pool, device, self._decode_call, replay=device.type == "cuda")

    @torch.inference_mode()
    def forward(self, inputs: list[RowInput], num_layers: int | None = None,
                interrupt: Callable[[], bool] | None = None) -> list[torch.Tensor]:  # fmt: skip
        """Run one forward; returns, per input, float32 logits ``[num_kept, vocab_size]``.

        ``interrupt``: asked before each decoder layer of an eager forward; when it answers True the
        forward stops there with ``StepInterrupted`` (an urgent request goes first, ``engine/urgent.py``).
        A compiled forward or a replayed graph is never interrupted: a hook would force it eager.

        ``num_layers``: run only the first decoder layers, then the final norm and LM head
        (self-speculative early exit, as HF's ``EarlyExitCandidateGenerator``); their K/V land
        in the same slots, where the full forward that verifies the drafts rewrites them.
        """
        adapters = self._adapters(inputs)  # a step with adapters never replays a graph captured without
        if self.graphs is not None and num_layers is None and not adapters and self.graphs.serves(inputs):
            replayed = self.graphs.forward(inputs)
            if replayed is not None:
                return replayed
        # Single-token rows first: StepLayout batches them into one attention call.
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i].token_ids) != 1)
        segments: list[Segment] = []
        flat_ids: list[int] = []
        keep: list[int] = []
        kept_ranges: dict[int, tuple[int, int]] = {}
        offsets: dict[int, int] = {}
        for i in order:
            row = inputs[i]
            offset = len(flat_ids)
            offsets[i] = offset
            segments.append(Segment(row.slot, row.start, len(row.token_ids), row.siblings))
            flat_ids.extend(row.token_ids)
            first = len(keep)
            keep.extend(range(offset + row.logits_from, offset + len(row.token_ids)))
            kept_ranges[i] = (first, len(keep))
        for seg in segments:  # grow block tables, copy shared blocks about to be written (no-op if planned)
            self.pool.prepare(seg.slot, seg.start, seg.start + seg.length)
        layout = StepLayout(self.pool, segments, self.device)
        input_ids = torch.tensor([flat_ids], dtype=torch.long, device=self.device)  # [1, num_tokens]
        wanted = sorted({layer for row in inputs for layer in row.hidden_layers})
        early_exit = num_layers is not None and num_layers < self.num_layers
        # with adapters the step runs eagerly: a compiled graph was traced with no adapter step
        token_adapters = [adapters[inputs[i].slot] for i in order for _ in inputs[i].token_ids] if adapters else []
        lora_step = self.lora.bank.step_for(token_adapters) if adapters else None
        compiled = self.compiled and not (wanted or early_exit or lora_step)
        keep_index = torch.tensor(keep or [len(flat_ids) - 1], dtype=torch.long, device=self.device)
        captured: dict[int, torch.Tensor] = {}
        with ExitStack() as context:
            for layer in wanted:
                context.enter_context(self._capture(layer, captured))
            if early_exit:
                context.enter_context(self._exit_after(num_layers - 1))
            if interrupt is not None and not self.compiled:
                context.enter_context(self._interruptible(interrupt))
            if self.compiled and not compiled:  # hooks into layers run outside any graph
                context.enter_context(torch.compiler.set_stance("force_eager"))
            # beside the call always: a compiled forward reads it there, and so do the attention modules
            # of families that do not pass their keyword arguments down (StableLM); eager ones that
            # do get it as an argument, which skips the custom op's dispatch
            context.enter_context(active_layout(layout, compiled))
            if lora_step is not None:
                context.enter_context(self.lora.bank.active(lora_step))
            kwargs = {} if compiled else {LAYOUT_KWARG: layout}
            images = [(offsets[i], inputs[i].image_features) for i in order if inputs[i].image_features is not None]
            if self.git:  # its features replace the image positions' hidden states after its embeddings
                kwargs = {LAYOUT_KWARG: layout, "images": images}
            elif images:  # the image tokens' embeddings are the vision tower's features
                kwargs["inputs_embeds"] = self._embeddings(input_ids, images)
            positions = layout.token_positions.unsqueeze(0)
            if layout.rope_positions is not None:  # Qwen2-VL: [3, 1, num_tokens]
                positions = layout.rope_positions.unsqueeze(1)
            try:
                out_logits = self._logits(input_ids, positions, keep_index, kwargs)
            except _ExitReached as exit_:
                out_logits = self._head(exit_.hidden[:, keep_index])
        for i, row in enumerate(inputs):
            row.hidden = {
                layer: captured[layer][0, offsets[i] : offsets[i] + len(row.token_ids)] for layer in row.hidden_layers
            }
        logits = out_logits[0].float()  # [num_kept, vocab_size]
        return [logits[kept_ranges[i][0] : kept_ranges[i][1]] for i in range(len(inputs))]

    def _logits(self, input_ids: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor,
                kwargs: dict) -> torch.Tensor:  # fmt: skip
        """``[1, kept, vocab]``: the whole model's, an encoder-decoder's decoder alone (its cross-attention
        reads the encoder's keys and values from the pool), or GIT's own forward (``git_forward``)."""
        if self.seq2seq:
            return decoder_logits(self.model, input_ids, positions, keep, **kwargs)
        if self.git:
            return git_logits(self.model, input_ids, keep, kwargs[LAYOUT_KWARG], kwargs["images"])
        ids = None if "inputs_embeds" in kwargs else input_ids
        return self.model(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=keep,
                          **kwargs).logits  # fmt: skip

    def _embeddings(self, input_ids: torch.Tensor, images: list[tuple[int, tuple[torch.Tensor, torch.Tensor]]]
                    ) -> torch.Tensor:  # fmt: skip
        """``[1, num_tokens, hidden]`` input embeddings with each image token's replaced by its feature. The
        placeholder ids are looked up as 0 first: some families' image token lies past the text vocabulary."""
        ids = input_ids.clone()
        where = torch.cat([offsets + start for start, (offsets, _) in images])
        ids[0, where] = 0
        embeds = self.model.get_input_embeddings()(ids)
        features = torch.cat([feats for _, (_, feats) in images]).to(embeds.dtype)
        embeds[0, where] = features
        return embeds

    def _adapters(self, inputs: list[RowInput]) -> dict[int, int]:
        """Each row's adapter slot by KV slot, or nothing when no row of the step has an adapter."""
        if self.lora is None:
            return {}
        slots = {row.slot: self.lora.kv_adapter[row.slot] for row in inputs}
        return slots if any(slots.values()) else {}

    def _decode_call(
        self, input_ids: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor, layout: StepLayout
    ) -> torch.Tensor:
        """The eager forward of a decode-only step on a graph's static inputs: ``[rows, vocab]`` logits."""
        with active_layout(layout):
            out = self.model(input_ids=input_ids, position_ids=positions, use_cache=False, logits_to_keep=keep,
                             **{LAYOUT_KWARG: layout})  # fmt: skip
        return out.logits[0]

    def _exit_after(self, layer: int) -> _Removable:
        """Stop the forward after decoder layer ``layer`` (early exit) without touching the model."""

        def stop(module, args, output):  # noqa: ANN001, ANN202
            raise _ExitReached(output[0] if isinstance(output, tuple) else output)

        return _Removable(self.layers[layer].register_forward_hook(stop))

    def _interruptible(self, interrupt: Callable[[], bool]) -> ExitStack:
        """Ask ``interrupt`` before every decoder layer; stop the forward when it answers True."""

        def check(module, args):  # noqa: ANN001, ANN202
            if interrupt():
                raise StepInterrupted

        hooks = ExitStack()
        for layer in self.layers:
            hooks.enter_context(_Removable(layer.register_forward_pre_hook(check)))
        return hooks

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm and LM head on hidden states that stopped early (``[1, kept, hidden]``), with
        the logit scaling the config declares (Cohere's ``logit_scale``, Granite's ``logits_scaling``,
        Gemma 2's ``final_logit_softcapping``); it only shapes drafts, the full forward verifies them."""
        config = self.model.config.get_text_config()
        logits = self.model.get_output_embeddings()(self.norm(hidden))
        if getattr(config, "logit_scale", None) is not None:
            logits = logits * config.logit_scale
        if getattr(config, "logits_scaling", None) is not None:
            logits = logits / config.logits_scaling
        cap = getattr(config, "final_logit_softcapping", None)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _capture(self, layer: int, into: dict[int, torch.Tensor]):  # noqa: ANN202
        """A hook recording HF's ``hidden_states[layer]`` (``[1, num_tokens, hidden]``) for this forward.

        Hooks instead of ``output_hidden_states=True`` so only the layers somebody asked for are
        kept, and so the final entry is the normed output as in transformers 4.x.
        """
        if layer == self.num_layers:

            def after_norm(module, args, output):  # noqa: ANN001, ANN202
                into[layer] = output[0] if isinstance(output, tuple) else output

            # a decoder with no final norm (Bart's, Marian's): the last layer's output is the last state
            last = self.layers[-1] if isinstance(self.norm, torch.nn.Identity) else self.norm
            return _Removable(last.register_forward_hook(after_norm))

        def before_layer(module, args, kwargs):  # noqa: ANN001, ANN202
            into[layer] = args[0] if args else kwargs["hidden_states"]

        return _Removable(self.layers[layer].register_forward_pre_hook(before_layer, with_kwargs=True))


class _Removable:
    """A hook handle usable as a context manager."""

    def __init__(self, handle: torch.utils.hooks.RemovableHandle) -> None:
        self.handle = handle

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()
