"""``POST /v1/chat/completions``: its body (``protocol``), its output (``format``), its handler (``route``)."""
