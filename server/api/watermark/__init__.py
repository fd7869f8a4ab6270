"""``POST /v1/watermark/detect``: its body (``protocol``) and its handler (``route``)."""
