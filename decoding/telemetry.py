"""What the engine tells the outside world about its work, as plain method calls.

The engine knows when a request waited, produced its first token, emitted each token and
finished; how those become Prometheus series is the HTTP layer's business (``server/http/metrics.py``
implements this interface). Keeping it an interface lets decoding/ stay free of the exporter.
Called from the worker thread; implementations must be thread-safe and cheap.
"""

from __future__ import annotations


class EngineObserver:
    """Default: observe nothing. Subclass and override what you need."""

    def on_admitted(self, strategy: str, queue_seconds: float, num_prompt_tokens: int) -> None: ...

    def on_first_token(self, strategy: str, ttft_seconds: float) -> None: ...

    def on_tokens(self, strategy: str, num_tokens: int, inter_token_seconds: list[float]) -> None: ...

    def on_finished(self, strategy: str, finished_reason: str, e2e_seconds: float) -> None: ...

    def on_step(self, num_rows: int, num_running: int, num_waiting: int, kv_usage: float) -> None: ...

    def on_prefix_cache(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        """A prompt of ``num_queried_tokens`` looked up in the prefix cache; ``num_hit_tokens`` were there."""

    def on_preempted(self) -> None:
        """A running request gave its KV blocks back (swapped out) because the pool ran out."""

    def on_speculation(self, proposer: str, num_drafted: int, num_accepted: int) -> None:
        """One verification of ``num_drafted`` draft tokens by ``proposer`` (an assistant's name,
        ``prompt_lookup`` or ``early_exit``), of which the first ``num_accepted`` were kept."""

    def on_grammar_compiled(self, cached: bool, seconds: float) -> None:
        """A structured output's constraint was compiled (``seconds``) or found compiled (``cached``)."""

    def on_transcribed(self, audio_seconds: float, seconds: float) -> None:
        """A transcription or translation of ``audio_seconds`` of audio finished after ``seconds``."""

    def on_images_encoded(self, num_images: int, seconds: float) -> None:
        """The vision tower ran on one prompt's ``num_images`` images in ``seconds`` (a prompt whose image
        tokens the prefix cache held never runs it)."""

    def on_grammar_failed(self, reason: str) -> None:
        """A request's constraint could not go on (``reason``: "error", its matcher's error state, or
        "budget", its masks over their time budget): the request failed with a 400."""

    def on_cache_config(self, block_size: int, num_blocks: int, prefix_caching: bool) -> None:
        """The KV pool, once at start: positions per block, blocks in the pool, whether prefixes are
        shared (vLLM's ``cache_config_info``: what a prefix-aware router sizes its own index by)."""

    def on_lora_requests(self, running: list[str], waiting: list[str], max_loras: int) -> None:
        """The LoRA adapters running requests use now, those waiting requests need, and ``--max-loras``
        (vLLM's ``lora_requests_info``: what a LoRA-aware router reads)."""
