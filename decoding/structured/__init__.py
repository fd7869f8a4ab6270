"""Structured outputs: a request's schema, regex, choice or grammar compiled once (llguidance) into
the matcher every row of it copies; the mask it yields is one stage of ``decoding.sampling``."""
