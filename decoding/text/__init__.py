"""Token ids to the text a client sees: incremental detokenizing, streamed deltas, and every stop rule."""
