"""What a CTranslate2 Whisper folder says besides its weights: the tokenizer, the feature extractor and
the generation config transformers' ``WhisperForConditionalGeneration.generate()`` reads.

Where the folder carries a value it is taken from there:

* ``config.json`` (CTranslate2's ``WhisperConfig``, written from the original generation config):
  ``alignment_heads``, ``suppress_ids`` → ``suppress_tokens``, ``suppress_ids_begin`` →
  ``begin_suppress_tokens``, ``lang_ids`` → ``lang_to_id`` (each id named by its token, ``<|en|>``);
* ``tokenizer.json``: the ids of ``<|endoftext|>`` (bos, eos, pad), ``<|startoftranscript|>``
  (``decoder_start_token_id``), ``<|notimestamps|>``, ``<|startofprev|>``, ``<|transcribe|>`` and
  ``<|translate|>`` (``task_to_id``);
* ``vocabulary.txt`` (one token a line, the model's whole vocabulary): the timestamp tokens
  ``<|0.00|>`` ... ``<|30.00|>`` after the special ones, which ``tokenizer.json`` lacks; they are added
  to the tokenizer as plain (not special) tokens, as the hub's Whisper tokenizers have them, so
  every id the model can say has a token (``WhisperTokenizer`` finds the first timestamp id as
  the last special id + 1, so they must not be special).

The rest is Whisper's own documented values: ``is_multilingual`` when the folder lists languages;
``max_initial_timestamp_index`` 50 (openai-whisper's ``max_initial_timestamp`` of 1.0 s at 0.02 s per
timestamp token, faster-whisper's default too); ``max_length`` the decoder's positions (448); the
feature extractor's 16 kHz, 30 s windows, 400-sample FFT and 160-sample hop (openai-whisper's
``audio.py``), with as many mel bins as the encoder's first convolution reads (80, large-v3's 128).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from transformers import GenerationConfig, WhisperFeatureExtractor, WhisperTokenizer

from decoding.model.ct2_file import Ct2FormatError

SAMPLING_RATE = 16_000
CHUNK_SECONDS = 30
MAX_INITIAL_TIMESTAMP_INDEX = 50  # openai-whisper: max_initial_timestamp 1.0 s / 0.02 s per token
FILES = ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt")
_SPECIAL = {
    "eos": "<|endoftext|>",
    "decoder_start": "<|startoftranscript|>",
    "no_timestamps": "<|notimestamps|>",
    "prev_sot": "<|startofprev|>",
    "transcribe": "<|transcribe|>",
    "translate": "<|translate|>",
}


def check_folder(folder: Path) -> None:
    """Every file a CTranslate2 Whisper folder needs is there; the error names what is missing."""
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise Ct2FormatError(f"{folder} is not a CTranslate2 Whisper folder: {', '.join(missing)} missing")


def added_token_ids(folder: Path) -> dict[str, int]:
    """``tokenizer.json``'s added (special) tokens by their text."""
    tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    return {token["content"]: token["id"] for token in tokenizer.get("added_tokens", [])}


def special_ids(folder: Path) -> dict[str, int]:
    """The ids Whisper's generation needs by role; an absent token is a format error naming it."""
    added = added_token_ids(folder)
    missing = [token for token in _SPECIAL.values() if token not in added]
    if missing:
        raise Ct2FormatError(f"{folder / 'tokenizer.json'} lacks Whisper's {', '.join(missing)}")
    ids = {role: added[token] for role, token in _SPECIAL.items()}
    return ids | {"bos": ids["eos"], "pad": ids["eos"]}


def _ct2_config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text(encoding="utf-8"))


def vocabulary(folder: Path) -> list[str]:
    """``vocabulary.txt``'s tokens, by id (a line each; the file ends with a newline)."""
    return (folder / "vocabulary.txt").read_text(encoding="utf-8").split("\n")[:-1]


def whisper_generation_config(folder: Path, max_length: int, vocab_size: int) -> GenerationConfig:
    """Whisper's generation settings: the folder's where it has them, Whisper's documented ones else."""
    ids, ct2, tokens = special_ids(folder), _ct2_config(folder), vocabulary(folder)
    if len(tokens) != vocab_size:
        raise Ct2FormatError(f"{folder / 'vocabulary.txt'} has {len(tokens)} tokens; the model has {vocab_size}")
    lang_to_id = {tokens[i]: i for i in ct2.get("lang_ids", [])}
    return GenerationConfig(
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        decoder_start_token_id=ids["decoder_start"],
        no_timestamps_token_id=ids["no_timestamps"],
        prev_sot_token_id=ids["prev_sot"],
        task_to_id={"transcribe": ids["transcribe"], "translate": ids["translate"]},
        lang_to_id=lang_to_id,
        is_multilingual=bool(lang_to_id),
        alignment_heads=[list(pair) for pair in ct2.get("alignment_heads", [])],
        suppress_tokens=list(ct2.get("suppress_ids", [])),
        begin_suppress_tokens=list(ct2.get("suppress_ids_begin", [])),
        max_initial_timestamp_index=MAX_INITIAL_TIMESTAMP_INDEX,
        max_length=max_length,
    )


def whisper_tokenizer(folder: Path) -> WhisperTokenizer:
    """``tokenizer.json`` as transformers' Whisper tokenizer, with the timestamp tokens appended."""
    tokenizer = WhisperTokenizer(
        tokenizer_file=str(folder / "tokenizer.json"),
        unk_token=_SPECIAL["eos"],
        bos_token=_SPECIAL["eos"],
        eos_token=_SPECIAL["eos"],
        pad_token=_SPECIAL["eos"],
    )
    tokens = vocabulary(folder)
    timestamps = tokens[len(tokenizer) :]
    if timestamps and not all(t.startswith("<|") and t.endswith("|>") for t in timestamps):
        raise Ct2FormatError(f"{folder / 'vocabulary.txt'} continues past tokenizer.json with non-timestamp tokens")
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in timestamps])
    if len(tokenizer) != len(tokens):
        raise Ct2FormatError(f"the tokenizer has {len(tokenizer)} tokens; vocabulary.txt has {len(tokens)}")
    return tokenizer


def whisper_feature_extractor(num_mel_bins: int) -> WhisperFeatureExtractor:
    """Log-mel features as Whisper computes them: 16 kHz, 30 s windows, 25 ms FFT, 10 ms hop."""
    return WhisperFeatureExtractor(
        feature_size=num_mel_bins, sampling_rate=SAMPLING_RATE, chunk_length=CHUNK_SECONDS, hop_length=160, n_fft=400
    )
