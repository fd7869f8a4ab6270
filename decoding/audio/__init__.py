"""Audio input: an uploaded file to the 16 kHz mono float32 samples Whisper's feature extractor reads."""

from decoding.audio.decode import AudioInputError, DecodedAudio, decode_audio

__all__ = ["AudioInputError", "DecodedAudio", "decode_audio"]
