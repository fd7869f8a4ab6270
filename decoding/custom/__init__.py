"""Custom decoding methods (HF's ``custom_generate``): loading them at start, the HF interfaces a
method is handed, and the queue of exclusive jobs the engine runs between steps. What a request
may ask of a method (torch-free) is ``decoding.params.custom_methods``."""
