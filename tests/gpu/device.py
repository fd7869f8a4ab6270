"""Where tests/gpu run: CUDA, or the CPU with ``DECODA_GPU_TESTS_ON=cpu`` (their logic checked before a
GPU run; graphs then run their padded steps eagerly instead of replaying captures)."""

import os

DEVICE = os.environ.get("DECODA_GPU_TESTS_ON", "cuda")
