"""How much of the engine's time prompt work may take while other requests are decoding (``--max-prefill-share``).

On a GPU a step's prompt tokens ride nearly free beside its decode rows; on a CPU every prompt token costs
about what a decode row costs, and a vision tower call is one indivisible lump of seconds, so a stream of
long prompts (images above all) slows every running stream in proportion. TGI's router answers this with
``--waiting-served-ratio`` / ``--max-waiting-tokens`` (decode steps before waiting prompts join); this is the
same trade stated in time: over the steps that carry decode rows, prompt work takes at most ``share`` of the
engine's time. The share is kept as a credit (a token bucket): every such step earns ``share`` of its
seconds and spends its prompt part (the vision tower's time plus the forward's time in proportion to its
prompt tokens). While the credit is below zero, a step carries only a trickle of prompt tokens (no more
than it has decode tokens, and never a vision tower call), so short prompts still start and a long one
waits for its turn; steps without decode rows are not limited. The credit is bounded both ways, so an
idle stretch banks no burst and one huge prompt is not paid off for minutes. Because of that bound, a
step that rows decode beside takes one request's images through the tower at most: eight images in one
step would spend seconds that the bounded debt forgets (measured: 16 image clients beside 16 text
clients took 22% of the time in the tower at a share of 0.1), while one at a time each is paid for
before the next.

``share`` 1 (the default) limits nothing: a step's prompt chunks take what its token budget leaves, as in
vLLM.
"""

from __future__ import annotations

CREDIT_BOUND_SECONDS = 2.0  # the credit never leaves [-bound, +bound]


class PrefillShare:
    def __init__(self, share: float = 1.0) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"max_prefill_share must be in (0, 1], got {share}")
        self.share = share
        self.credit = 0.0  # seconds of prompt work the decoding streams can still afford

    @property
    def unlimited(self) -> bool:
        return self.share >= 1

    def limited(self, num_decode_tokens: int) -> bool:
        """Whether this step's prompt work is held to a trickle: rows decode and the credit is spent."""
        return not self.unlimited and num_decode_tokens > 0 and self.credit < 0

    def one_tower_call_a_step(self, num_decode_tokens: int) -> bool:
        """Whether this step takes at most one request's images through the vision tower: prompt work has a
        share and rows decode, so the next image waits for the credit the last one leaves."""
        return not self.unlimited and num_decode_tokens > 0

    def record(self, seconds: float, prompt_tokens: int, decode_tokens: int, vision_seconds: float = 0.0) -> None:
        """Book a step that took ``seconds`` (``vision_seconds`` of them in the vision tower) and fed
        ``prompt_tokens`` prompt tokens beside ``decode_tokens`` decode tokens."""
        if self.unlimited or decode_tokens == 0:
            return
        forward = max(seconds - vision_seconds, 0.0)
        prompt_part = vision_seconds + forward * prompt_tokens / (prompt_tokens + decode_tokens)
        credit = self.credit + self.share * seconds - prompt_part
        self.credit = min(max(credit, -CREDIT_BOUND_SECONDS), CREDIT_BOUND_SECONDS)
