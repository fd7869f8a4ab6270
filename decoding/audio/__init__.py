"""Audio input: an uploaded file to the 16 kHz mono float32 samples Whisper's feature extractor reads."""

from decoding.audio.decode import SAMPLING_RATE, AudioInputError, decode_audio

__all__ = ["SAMPLING_RATE", "AudioInputError", "decode_audio"]
