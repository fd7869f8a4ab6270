"""decoding.audio: every format OpenAI's audio API accepts decodes to 16 kHz mono float32 of the right
length; what is not audio, empty, cut inside its header, too big or too long is an AudioInputError with
the reason, and a file that expands to more than the duration limit stops being decoded at the limit."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from decoding.audio import AudioInputError, decode_audio

SECONDS = 1.5
RATE = 44_100  # not 16 kHz: the decoder resamples
# (container format, codec, file suffix): what browsers, phones and tools send
FORMATS = [
    ("wav", "pcm_s16le", "wav"),
    ("flac", "flac", "flac"),
    ("mp3", "libmp3lame", "mp3"),
    ("ogg", "libopus", "ogg"),
    ("webm", "libopus", "webm"),
    ("ipod", "aac", "m4a"),
    ("mp4", "aac", "mp4"),
]


def stereo_tone(seconds: float = SECONDS, rate: int = RATE) -> np.ndarray:
    """A 440 Hz tone on the left, 660 Hz on the right: [2, samples] float32."""
    t = np.arange(int(seconds * rate)) / rate
    return np.stack([0.4 * np.sin(2 * np.pi * 440 * t), 0.4 * np.sin(2 * np.pi * 660 * t)]).astype(np.float32)


def encode(container_format: str, codec: str, audio: np.ndarray, rate: int = RATE) -> bytes:
    """``audio`` [channels, samples] encoded with PyAV's own encoders into an in-memory file."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_format) as out:
        stream = out.add_stream(codec, rate=48_000 if "opus" in codec else rate, layout="stereo")
        frame_size = 1024
        for start in range(0, audio.shape[1], frame_size):
            chunk = np.ascontiguousarray(audio[:, start : start + frame_size])
            frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="stereo")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return {suffix: encode(fmt, codec, stereo_tone()) for fmt, codec, suffix in FORMATS}


@pytest.mark.parametrize("suffix", [suffix for _, _, suffix in FORMATS])
def test_each_format_decodes_to_16k_mono_of_its_length(files: dict[str, bytes], suffix: str) -> None:
    samples = decode_audio(files[suffix])
    assert samples.dtype == np.float32 and samples.ndim == 1
    # 16 kHz: lossy codecs pad a frame or two of priming at the ends, within 60 ms
    assert samples.size == pytest.approx(SECONDS * 16_000, abs=0.06 * 16_000)
    # both channels are in the mix: the spectrum has 440 Hz and 660 Hz
    middle = samples[4000:20000]
    spectrum = np.abs(np.fft.rfft(middle))
    freqs = np.fft.rfftfreq(middle.size, 1 / 16_000)
    peaks = sorted(freqs[np.argsort(spectrum)[-2:]])
    assert peaks == pytest.approx([440, 660], abs=5)


def test_wav_samples_are_the_downmix_resampled() -> None:
    """PCM in, PCM out: the mono mix of a tone equal on both channels is the tone itself at 16 kHz."""
    t = np.arange(RATE) / RATE
    tone = (0.5 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
    samples = decode_audio(encode("wav", "pcm_s16le", np.stack([tone, tone])))
    expected = 0.5 * np.sin(2 * np.pi * 300 * np.arange(16_000) / 16_000)
    assert samples.size == 16_000 and np.max(np.abs(samples[200:-200] - expected[200:-200])) < 0.02


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"this is plain text, not audio at all\n" * 20, "not audio"),
        (bytes(range(256)) * 40, "not audio"),
        (b"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nfile:///etc/hostname\n#EXT-X-ENDLIST\n", "not audio"),
        (b"ffconcat version 1.0\nfile '/etc/hostname'\n", "not audio"),
    ],
)
def test_not_audio_is_refused_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(AudioInputError, match=reason):
        decode_audio(data)


def test_a_file_cut_inside_its_header_is_refused(files: dict[str, bytes]) -> None:
    for suffix in ("wav", "flac", "m4a", "webm"):
        with pytest.raises(AudioInputError):
            decode_audio(files[suffix][:30])


def test_a_file_without_an_audio_stream_is_refused() -> None:
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="webm") as out:
        stream = out.add_stream("libvpx", rate=10) if "libvpx" in av.codecs_available else None
        if stream is None:
            pytest.skip("PyAV has no libvpx encoder to make a video-only file")
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for i in range(3):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), i * 40, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    with pytest.raises(AudioInputError, match="no audio stream"):
        decode_audio(buffer.getvalue())


def test_over_the_byte_limit_is_refused_before_parsing(files: dict[str, bytes]) -> None:
    with pytest.raises(AudioInputError, match="limit is 100 bytes"):
        decode_audio(files["wav"], max_bytes=100)


def test_over_the_duration_limit_is_counted_from_the_decoded_frames() -> None:
    """Five minutes of silence in FLAC is a few kB (no header states a length it could lie about):
    the decoded frames are counted, and past the limit decoding stops with the reason."""
    silence = np.zeros((2, 300 * 8_000), np.float32)
    bomb = encode("flac", "flac", silence, rate=8_000)
    assert len(bomb) < 100_000
    with pytest.raises(AudioInputError, match="longer than the limit of 5 seconds"):
        decode_audio(bomb, max_seconds=5)
    assert decode_audio(bomb, max_seconds=301).size == pytest.approx(300 * 16_000, abs=1_600)


def test_only_the_containers_of_openais_formats_are_read() -> None:
    """Sun's .au is audio FFmpeg reads, but not a format the API takes: FFmpeg may not even probe it."""
    au = encode("au", "pcm_s16be", stereo_tone())
    assert av.open(io.BytesIO(au)).format.name == "au"  # FFmpeg itself reads it
    with pytest.raises(AudioInputError, match="not audio in a format this server reads"):
        decode_audio(au)
