"""The worker's engine and what drives it: the step loop (``core``), who runs next
(``scheduler``), prompt chunks (``prefill``), the drafting stage (``drafting``), the batched token
choice (``sample_stage``), the worker thread and its client (the bridge from the event loop), and
start-up (``launch``, ``prebuild``, ``warmup``)."""
