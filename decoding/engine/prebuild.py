"""A first start's one-time native builds, begun in the background while the model loads.

A machine's first start with ``--quantization gguf --compile`` ran the C++ compiler for most of a
minute, one build after another, each waiting for the one before: the paged-attention and block
operators (built when the load first needs them), then inductor's one-time set-up at the first
compile (a test program for each vector ISA the CPU reports, ~1 s of g++ each, and the precompiled
header of its kernels' prelude, ~5 s). All of that is work in other processes, while loading the
model is this process's Python, so begun together they overlap on a machine with two cores. The
operators are built by the same memoized call the load makes, behind a lock, so whichever thread
gets there first builds and the other waits; inductor's set-up fills inductor's own caches, which
its compile finds (or waits for, on the same file locks). Nothing here decides anything a start
without it would not (inductor's ISA is the one its own rule picks), and a build that fails here
fails (and is reported) where it would have without it.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

import torch

from decoding.config import EngineConfig
from decoding.model.inductor_cache import use_private_inductor_cache
from decoding.model.registry import quantization_for

logger = logging.getLogger(__name__)

BLOCK_KERNEL_MODES = ("gguf", "int4")  # whose codes the block operator multiplies where it fits


def start_builds(config: EngineConfig) -> Callable[[], None]:
    """Begin the builds this start will need; returns the wait for the operators and inductor's ISA,
    to call before the model's first forward. Inductor's precompiled header is not waited for: the
    compile's first steps (dynamo's tracing, AOT) need none of it, and where inductor needs it, it
    takes the same file lock the build holds, so it waits there for what is being built.

    The modules each build needs are imported here, on the calling thread: two threads importing
    the same modules at once can see one half-initialized (measured: transformers' lazy module).
    The server begins the builds before it imports the engine (their modules import torch alone);
    the engine's build calls this again, and a build already under way is waited for, not
    repeated."""
    if config.compile:  # before inductor builds or loads anything, and before its workers start
        use_private_inductor_cache()
    try:
        on_cpu = torch.device(config.device).type == "cpu"
    except RuntimeError:  # not a device: the engine's build says so, as it would without this
        on_cpu = False
    if not on_cpu:
        return lambda: None
    from decoding.kv import paged_attention
    from decoding.sampling import fast_argmax

    operators: list[Callable[[], object]] = [paged_attention.native_available, fast_argmax.available]
    quantization = quantization_for(config.model, config.quantization)  # ``auto`` as the load resolves it
    if quantization in BLOCK_KERNEL_MODES:
        from decoding.model.quantization import block_matrix

        operators.append(block_matrix.isa)
    if quantization == "gguf":  # a GGUF's K-quants (Q4_K, Q6_K) take the tiled kernel
        from decoding.model.quantization import ktile_matrix

        operators.append(ktile_matrix.isa)
    if config.serves_loras:
        from decoding.model.lora import native

        operators.append(native.available)
    # all at once: measured, a first gguf --compile start was ready 3 s sooner than with the block
    # operator and inductor's set-up one after the other (the compiler's processes share the cores)
    threads = [_start(job) for job in operators]
    if config.compile:  # after the operators' g++ has begun: importing inductor takes ~2 s
        importlib.import_module("torch._inductor.compile_fx")
        from torch._inductor.async_compile import AsyncCompile, get_compile_threads

        if get_compile_threads() > 1:  # the threads that run g++ on its kernels: made here, once
            AsyncCompile.pool()
        threads.append(_start(_inductor_isa))
        _start(_inductor_header)

    def wait() -> None:
        for thread in threads:
            thread.join()

    return wait


def _start(job: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=_run, args=(job,), name=f"prebuild-{job.__name__}", daemon=True)
    thread.start()
    return thread


def _run(job: Callable[[], object]) -> None:
    start = time.perf_counter()
    try:
        job()
    except Exception:  # the start makes the same call again, and reports its failure there
        logger.debug("background build %s failed", job.__name__, exc_info=True)
    logger.debug("background build %s: %.1f s", job.__name__, time.perf_counter() - start)


_isa_lock = threading.Lock()
_header_lock = threading.Lock()
_done: set[str] = set()


def _inductor_isa() -> None:
    """Settle the vector ISA inductor will compile its kernels for, probing only that one.

    Inductor tests every ISA the CPU reports (AVX-512 with VNNI, AVX-512, AVX2 here: three builds
    of ATen's vector headers, ~2 s of g++ each, and two small ones) and then uses the first that
    passes. The first is tested here with inductor's own check (compiled and loaded as inductor
    does); when it passes, the ones after it could never be used, so inductor is told the check is
    done (``cpp.vec_isa_ok``) instead of building them. When it fails, or when ``ATEN_CPU_CAPABILITY``
    asks for another ISA, or the user set ``TORCHINDUCTOR_VEC_ISA_OK``, inductor probes as it would."""
    with _isa_lock:
        if "isa" in _done:
            return
        from torch._inductor import config, cpu_vec_isa

        cpu_flags = set(cpu_vec_isa.x86_isa_checker())
        candidates = [isa for isa in cpu_vec_isa.supported_vec_isa_list if set(str(isa).split()) <= cpu_flags]
        unasked = config.cpp.vec_isa_ok is None and not os.environ.get("ATEN_CPU_CAPABILITY")
        if candidates and unasked and bool(candidates[0]):  # inductor's own check of the ISA it picks
            config.cpp.vec_isa_ok = True
        cpu_vec_isa.valid_vec_isa_list()  # cached: the compile finds the list made
        _done.add("isa")


def _inductor_header() -> None:
    """Build the precompiled header of inductor's kernels, at the lowest CPU priority.

    The header (~5 s of g++) is needed only when the first graph's kernels are compiled, seconds
    after the load; at full priority it took the cores from the imports, the load and the operators
    the load waits for. A thread's nice value applies to it alone on Linux and is inherited by the
    processes it starts, so this g++ runs on what the rest leaves idle (dynamo's tracing keeps one
    core busy, not two). The kernel is one as inductor writes them, built through inductor's own
    path, which makes the header the real kernels then use."""
    with _header_lock:
        if "header" in _done:
            return
        if sys.platform == "linux":  # elsewhere a thread's id is no process priority's target
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        _inductor_isa()  # the header is built for the ISA the kernels use
        from torch._inductor.codecache import CppPythonBindingsCodeCache

        CppPythonBindingsCodeCache.load_pybinding(["const float*", "float*", "const int64_t"], _KERNEL)
        _done.add("header")


_KERNEL = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C" void kernel(const float* in_ptr0, float* out_ptr0, const int64_t ks0)
{
    for (int64_t i = 0; i < ks0; i++) out_ptr0[i] = 2.0f * in_ptr0[i] + 1.0f;
}
"""
