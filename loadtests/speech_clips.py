"""The speech benchmark's clips and its score: English sentences spoken offline by Debian's ``espeak-ng``
(so the true text is known and no data set is downloaded), written as 16 kHz mono 16-bit wav, and the
word error rate of a server's transcripts against them.

Twelve sentences of different lengths (one to six seconds spoken) measure accuracy and clips per second;
one long clip, sentences from the same list joined with short silences to ``LONG_SECONDS`` (49 s: past
Whisper's 30 s window, so the server runs its long-form windows), measures the real-time factor. The
sentences hold no digits and no names: Whisper would write "nine" as "9" or spell a name its own way,
and the score would count the spelling, not the hearing.

Every server's transcript is normalised the same way before scoring (``normalise``): lower case, the
apostrophes dropped ("don't" and "dont" are one word), any other non-letter a space. WER is ``jiwer``'s
(the corpus rate: all edits over all reference words), the library speech benchmarks report with.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path

import jiwer
import numpy as np

from decoding.audio.decode import SAMPLING_RATE, decode_audio

SENTENCES = (
    "Good morning.",
    "Please close the window before you leave the house.",
    "Can you send me the report when it is ready?",
    "Turn left at the bridge and keep walking until you see the old church.",
    "Music helps me focus when I am working on a difficult problem late at night.",
    "She bought fresh bread, a bag of apples and some cheese at the market on the corner.",
    "The train to the coast was late again this morning, so we missed the first meeting.",
    "Our team finished the project a week early and celebrated with a long dinner by the river.",
    "Children were playing in the park while their parents talked quietly on the benches nearby.",
    "The weather forecast says it will rain tomorrow, but the weekend should be warm and sunny.",
    "The library opens early in the morning and closes in the evening, except on Sundays when it stays closed.",
    "Learning a new language takes patience, practice and a lot of listening to people who speak it every day.",
)
LONG_SECONDS = 49.0
MIN_GAP_S = 0.4  # the shortest silence between the long clip's sentences (and before the first, after the last)
MAX_GAP_S = 1.5  # longer silences than this would be padding, not speech: the clip would measure silence


@dataclass(frozen=True)
class Clip:
    """One wav file and the text spoken in it."""

    path: Path
    text: str
    seconds: float


def normalise(text: str) -> str:
    """The words of ``text`` as every server's transcript is scored: lower case, no apostrophes, no punctuation."""
    text = re.sub(r"['\u2019]", "", text.lower())
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text).split())


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """The corpus word error rate of ``hypotheses`` against ``references`` (both normalised here): all
    substitutions, deletions and insertions over all reference words."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} transcripts")
    return float(jiwer.wer([normalise(r) for r in references], [normalise(h) for h in hypotheses]))


def spoken(text: str) -> np.ndarray:
    """``text`` spoken by espeak-ng, as 16 kHz mono float32 samples (espeak-ng writes 22050 Hz; the server's
    own decoder resamples it, as every server is sent the same 16 kHz file)."""
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is not installed (Debian: apt-get install espeak-ng)")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "speech.wav"
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True, timeout=60)
        return decode_audio(path.read_bytes())


def write_wav(path: Path, samples: np.ndarray) -> None:
    """``samples`` (float in [-1, 1)) as a 16 kHz mono signed 16-bit wav."""
    pcm = np.clip(np.round(samples * 32768), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLING_RATE)
        out.writeframes(pcm.tobytes())


def long_plan(durations: list[float], target: float = LONG_SECONDS) -> tuple[int, float]:
    """(how many of the sentences, in order, the long clip holds; the silence around each): as many as fit
    ``target`` with at least ``MIN_GAP_S`` around each, the rest of ``target`` spread over the gaps."""
    count = 0
    while count < len(durations) and sum(durations[: count + 1]) + MIN_GAP_S * (count + 2) <= target:
        count += 1
    gap = (target - sum(durations[:count])) / (count + 1)
    if count == 0 or gap > MAX_GAP_S:
        raise ValueError(
            f"the sentences ({sum(durations):.1f} s spoken) cannot fill {target:.0f} s with short silences"
        )
    return count, gap


def make_clips(folder: Path) -> tuple[list[Clip], Clip]:
    """The sentences' clips and the long clip, written into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    voices = [spoken(text) for text in SENTENCES]
    clips = []
    for i, (text, samples) in enumerate(zip(SENTENCES, voices, strict=True)):
        path = folder / f"clip{i:02d}.wav"
        write_wav(path, samples)
        clips.append(Clip(path, text, len(samples) / SAMPLING_RATE))
    # the long clip speaks the longest sentences first: the most speech per second of clip
    order = sorted(range(len(SENTENCES)), key=lambda i: -len(voices[i]))
    count, gap = long_plan([len(voices[i]) / SAMPLING_RATE for i in order])
    silence = np.zeros(round(gap * SAMPLING_RATE), dtype=np.float32)
    parts = [silence]
    for i in order[:count]:
        parts += [voices[i], silence]
    samples = np.concatenate(parts)
    path = folder / "long.wav"
    write_wav(path, samples)
    text = " ".join(SENTENCES[i] for i in order[:count])
    return clips, Clip(path, text, len(samples) / SAMPLING_RATE)
