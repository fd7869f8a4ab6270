"""The paged KV cache: one pool of fixed-size blocks, block tables per row, the prefix cache, its
memory sizing, and the paged-attention kernel that reads blocks in place (with its C source)."""
