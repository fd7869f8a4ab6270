"""Image input: an uploaded image file checked and decoded to the RGB picture a vision-language
model's processor reads, beside the text pipeline (``decoding.text``) and uploaded audio
(``decoding.audio``)."""

from decoding.vision.image_files import IMAGE_FORMATS, open_image

__all__ = ["IMAGE_FORMATS", "open_image"]
