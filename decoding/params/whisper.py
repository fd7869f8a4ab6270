"""Whisper's own rules for what it may say next, as ``WhisperForConditionalGeneration.generate()`` adds
them to a request: torch-free, carried by ``GenerationParams.whisper`` and applied by
``decoding/sampling/whisper_rules.py``.

HF's Whisper ``generate()`` does not pass ``suppress_tokens`` and ``begin_suppress_tokens`` through the
generic knobs: it builds those processors itself, and, with timestamps, its timestamp processor, and
appends them after every processor and warper of the generation config (``_retrieve_logit_processors``,
then ``_merge_criteria_processor_list``). So a Whisper request's suppressions come after its temperature
and top-k/top-p, where the generic ``suppress_tokens`` knob comes before them; both orders are kept.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WhisperRules:
    begin_index: int  # the decoder prompt's length: where the transcript's tokens begin
    suppress_tokens: tuple[int, ...] = ()  # never said (HF's SuppressTokensLogitsProcessor)
    begin_suppress_tokens: tuple[int, ...] = ()  # never said first (SuppressTokensAtBeginLogitsProcessor)
    timestamps: bool = False  # WhisperTimeStampLogitsProcessor: timestamp tokens in pairs, never decreasing
    no_timestamps_token_id: int = 0  # ``<|notimestamps|>``; the timestamps are the ids after it
    eos_token_id: int = 0
    max_initial_timestamp_index: int | None = None  # the first timestamp's last allowed index (50: 1.00 s)

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps_token_id + 1
