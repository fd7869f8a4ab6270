"""OpenAI's audio API: ``POST /v1/audio/transcriptions`` and ``POST /v1/audio/translations``.

``form`` reads the multipart upload (the file bounded by ``--max-audio-bytes``, the other fields as the
JSON APIs' values), ``protocol`` is the body (OpenAI's fields over ``server.translate.fields``, so every HF
knob is a form field and takes the one translation), ``format`` writes a transcript out (json, text, srt,
vtt, verbose_json, OpenAI's stream events) and ``route`` is the handler.
"""
