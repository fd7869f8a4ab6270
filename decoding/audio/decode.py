"""An uploaded audio file → 16 kHz mono float32 samples, bounded in bytes, duration, memory and time.

OpenAI's audio API takes flac, mp3, mp4, mpeg, mpga, m4a, ogg, wav and webm; browsers record
webm/opus. All of them are decoded by FFmpeg's demuxers and decoders through PyAV (``av``: a
maintained binding that ships its own FFmpeg; nothing is shelled out), and FFmpeg's resampler
mixes the channels down to one and resamples to 16 kHz signed 16-bit, then divided by 32768: what
openai-whisper's ``ffmpeg -ac 1 -ar 16000 -f s16le`` and faster-whisper's ``decode_audio`` give,
so the samples are the ones Whisper's feature extractor was made for. (The 16-bit output matters
beyond precision: for integer output FFmpeg's downmix averages the channels; for float output it
would add them at -3 dB each, 1.41 times louder.)

Bounds, each an ``AudioInputError`` naming the reason: a file over ``max_bytes`` is refused before
it is parsed; one that is empty, not a container FFmpeg recognizes, without an audio stream, or
without a single decodable sample is refused with what was wrong. The duration is counted from the
decoded frames as they come (never from a header, which a hostile file can make claim anything),
and decoding stops at the first frame past ``max_seconds``: a tiny file that expands to hours (a
decompression bomb) costs at most ``max_seconds`` of decoding and 16 kHz float32 samples. The
input is read from memory only (FFmpeg gets a file object, no URL), and FFmpeg may read it only as
one of the containers those formats use (``DEMUXERS``), so a playlist cannot make it open anything.
"""

from __future__ import annotations

import io

import av
import numpy as np

SAMPLING_RATE = 16_000  # what Whisper's feature extractor reads
MAX_BYTES = 25 * 1024 * 1024  # OpenAI's upload limit (25 MB)
MAX_SECONDS = 2 * 60 * 60.0
# the only demuxers FFmpeg may pick (its ``format_whitelist``): the containers of OpenAI's formats (mov is
# mp4/m4a; matroska is webm; mpeg and mpegts are .mpeg; aac is raw ADTS). None of them opens another
# file or URL named inside the input, as playlists (hls, concat) would.
DEMUXERS = "wav,flac,mp3,ogg,matroska,webm,mov,aac,mpeg,mpegts"


class AudioInputError(ValueError):
    """The uploaded file cannot be transcribed; ``reason`` says why (for a 400 naming ``file``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def decode_audio(
    data: bytes, *, max_bytes: int = MAX_BYTES, max_seconds: float = MAX_SECONDS, sampling_rate: int = SAMPLING_RATE
) -> np.ndarray:
    """``data`` (a whole file in any format listed above) as mono float32 samples at ``sampling_rate``,
    in [-1, 1); its duration is ``len(samples) / sampling_rate``."""
    if not data:
        raise AudioInputError("the file is empty")
    if len(data) > max_bytes:
        raise AudioInputError(f"the file is {len(data)} bytes; the limit is {max_bytes} bytes")
    try:
        container = av.open(
            io.BytesIO(data), mode="r", container_options={"format_whitelist": DEMUXERS}, metadata_errors="ignore"
        )
    except (av.FFmpegError, ValueError) as error:
        raise AudioInputError(f"the file is not audio in a format this server reads ({_why(error)})") from error
    with container:
        name = container.format.name
        if not container.streams.audio:
            raise AudioInputError(f"the file ({name}) has no audio stream")
        stream = container.streams.audio[0]
        codec = stream.codec_context.name
        samples = _decode(container, stream, max_seconds, sampling_rate)
    if samples.size == 0:
        raise AudioInputError(f"the file ({name}, {codec}) holds no decodable audio")
    return samples


def _decode(container: av.container.InputContainer, stream: av.AudioStream, max_seconds: float,
            sampling_rate: int) -> np.ndarray:  # fmt: skip
    """Decode frame by frame, counting the input's seconds; stop at the first frame past the limit."""
    resampler = av.AudioResampler(format="s16", layout="mono", rate=sampling_rate)
    pieces: list[np.ndarray] = []
    seconds = 0.0
    try:
        for frame in container.decode(stream):
            if not frame.sample_rate:
                raise AudioInputError("the audio stream has no sample rate")
            seconds += frame.samples / frame.sample_rate
            if seconds > max_seconds:
                raise AudioInputError(f"the audio is longer than the limit of {max_seconds:g} seconds")
            pieces.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(frame))
        pieces.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(None))
    except (av.FFmpegError, ValueError) as error:
        if isinstance(error, AudioInputError):
            raise
        raise AudioInputError(f"the audio could not be decoded ({_why(error)})") from error
    samples = np.concatenate(pieces) if pieces else np.zeros(0, np.int16)
    return samples.astype(np.float32) / 32768.0


def _why(error: Exception) -> str:
    """FFmpeg's own words, without the file name it puts in (a memory buffer's has no meaning)."""
    strerror = getattr(error, "strerror", None)
    return str(strerror) if strerror else str(error) or type(error).__name__
