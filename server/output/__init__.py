"""Engine outputs to the wire, the same for every API: accumulating a body (``collect``), the shared
envelope and usage (``envelope``), logprobs shapes, the tool-call parser, SSE and disconnects
(``streaming``)."""
