"""``POST /tokenize`` and ``POST /detokenize``: the served tokenizer, in vLLM's shapes."""
