"""A request body to ``decoding.GenerationParams``, the same for every API: the fields they share
(``fields``), the one alias and length table (``aliases``), the translation (``params``), presets,
the size check (``sizes``), structured outputs, tools, guidance and the watermark field."""
