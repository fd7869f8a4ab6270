"""``POST /v1/completions``: its body (``protocol``), its output (``format``), its handler (``route``)."""
