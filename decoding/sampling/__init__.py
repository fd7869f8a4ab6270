"""Batched logits processing and token picking; see batch.py for the order and the HF classes."""

from decoding.sampling.batch import SamplingBatch
from decoding.sampling.row_state import RowSamplingState, make_generator
from decoding.sampling.sampler import BatchSampler

__all__ = ["BatchSampler", "RowSamplingState", "SamplingBatch", "make_generator"]
