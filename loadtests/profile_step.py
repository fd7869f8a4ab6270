"""Where a decode step's time goes, at 1 and 8 rows, through the engine as the server runs it.

Loads a model as ``decoda serve`` does (``load_model`` + ``prepare_forward``, the engine's paged
attention), starts ``rows`` greedy requests (a chat prompt, then forced-length decoding), and times
the measured steps' parts with module hooks:

- MLP linears (gate, up, down), attention projections (query, key, value, output), the LM head:
  the block kernels, each call's own time;
- attention: the attention modules' time minus their projections (RoPE, the K/V write, the
  paged-attention kernel);
- other forward: the rest of the model's forward (embedding lookups, norms, the MLP's activation
  and product, residual adds);
- outside the forward: the engine's step minus the forward (scheduling, sampling, stop checks,
  detokenizing, streaming to the emitter).

Hooks cost ~1 us a module call (~200 a step here); the unhooked step time is printed beside them.
Then the prefill of a long prompt (``--prompt-file``, a tool-laden 494-token prompt by default) alone,
as a new request's first step: its time, the TTFT's engine part.

    .venv/bin/python -m loadtests.profile_step --model qwen2.5-coder-1.5b --rows 1,8
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from decoding.engine.core import Engine
from decoding.engine.launch import prepare_forward
from decoding.engine.limits import EngineLimits
from decoding.engine.warmup import warm_up
from decoding.model.attention import register_attention
from decoding.model.loading import load_model
from decoding.params import GenerationParams
from loadtests.compare import cpu_summary

PROMPT = "Write a Python function that parses an ISO 8601 date and explain each step."


class Timers:
    """Per-part seconds from forward pre/post hooks; nested linears are taken out of their attention."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.spent = dict.fromkeys(("linears", "projections", "head", "attention", "forward"), 0.0)
        self.handles = []
        head = model.get_output_embeddings()
        for name, module in model.named_modules():
            kind = type(module).__name__
            if module is head:
                self._time(module, "head")
            elif kind in ("QuantizedLinear", "Linear", "PackedLinear"):
                leaf = name.rpartition(".")[2]
                self._time(module, "projections" if leaf in ("q_proj", "k_proj", "v_proj", "o_proj") else "linears")
            elif kind.endswith("Attention"):
                self._time(module, "attention")
        self._time(model, "forward")

    def _time(self, module: torch.nn.Module, key: str) -> None:
        started: list[float] = []

        def pre(*_: object) -> None:
            started.append(time.perf_counter())

        def post(*_: object) -> None:
            self.spent[key] += time.perf_counter() - started.pop()

        self.handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]

    def reset(self) -> None:
        self.spent = dict.fromkeys(self.spent, 0.0)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def run_steps(engine: Engine, prompt: list[int], rows: int, steps: int) -> tuple[list[float], float]:
    """The measured steps' wall times, and their process CPU time in ms a step."""
    with torch.inference_mode():
        for row in range(rows):
            params = GenerationParams(max_new_tokens=steps + 8, min_new_tokens=steps + 8, seed=row)
            engine.add_request(f"profile-{time.monotonic_ns()}-{row}", prompt, params)
        for _ in range(4):  # the prefill and the first steps
            engine.step()
        times = []
        used = time.process_time()
        for _ in range(steps):
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
        cpu = (time.process_time() - used) / steps * 1000
        while engine.has_work():
            engine.step()
    return times, cpu


def split(spent: dict[str, float], whole_ms: float) -> str:
    """The parts of ``whole_ms`` from the timers' milliseconds (attention without its projections)."""
    attention = spent["attention"] - spent["projections"]
    parts = {
        "MLP linears": spent["linears"],
        "attention projections": spent["projections"],
        "LM head": spent["head"],
        "attention": attention,
        "other forward": spent["forward"] - spent["linears"] - spent["projections"] - spent["head"] - attention,
        "outside forward": whole_ms - spent["forward"],
    }
    return ", ".join(f"{name} {ms:.1f} ({ms / whole_ms:.0%})" for name, ms in parts.items())


def profile(engine: Engine, model: torch.nn.Module, prompt: list[int], rows: int, steps: int, hooks: bool) -> str:
    plain, cpu = run_steps(engine, prompt, rows, steps)
    step = statistics.mean(plain) * 1000
    head = f"{rows} rows: step {step:.1f} ms ({rows / step * 1000:.1f} tok/s; CPU time {cpu:.1f} ms)"
    if not hooks:  # a compiled forward: hooks would break its graphs
        return f"{head} [compiled]"
    timers = Timers(model)
    try:
        measured, _ = run_steps_measured(engine, prompt, rows, steps, timers)
    finally:
        timers.remove()
    spent = {key: value / steps * 1000 for key, value in measured.items()}
    hooked_step = spent.pop("step")
    return f"{head}, with hooks {hooked_step:.1f} ms: {split(spent, hooked_step)}"


def run_steps_measured(
    engine: Engine, prompt: list[int], rows: int, steps: int, timers: Timers
) -> tuple[dict[str, float], Engine]:
    """``steps`` decode steps after the prefill, their parts from ``timers`` and their whole as ``step``."""
    with torch.inference_mode():
        for row in range(rows):
            params = GenerationParams(max_new_tokens=steps + 8, min_new_tokens=steps + 8, seed=row)
            engine.add_request(f"profile-{time.monotonic_ns()}-{row}", prompt, params)
        for _ in range(4):
            engine.step()
        timers.reset()
        whole = 0.0
        for _ in range(steps):
            start = time.perf_counter()
            engine.step()
            whole += time.perf_counter() - start
        spent = dict(timers.spent, step=whole)
        while engine.has_work():
            engine.step()
    return spent, engine


def op_table(engine: Engine, prompt: list[int], rows: int, steps: int, top: int) -> str:
    """torch.profiler's table of the ops of ``steps`` decode steps at ``rows`` rows (self CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        for row in range(rows):
            params = GenerationParams(max_new_tokens=steps + 8, min_new_tokens=steps + 8, seed=row)
            engine.add_request(f"ops-{time.monotonic_ns()}-{row}", prompt, params)
        for _ in range(4):
            engine.step()
        with profile(activities=[ProfilerActivity.CPU]) as recorded:
            for _ in range(steps):
                engine.step()
        while engine.has_work():
            engine.step()
    return recorded.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def prefill_ms(engine: Engine, tokenizer: object, text: str, repeats: int, timers: Timers | None = None,
               cpu: list[float] | None = None) -> list[float]:  # fmt: skip
    """A new request's first step (its whole prompt) for ``text`` with a head of its own each time; the
    process's CPU time of each is appended to ``cpu`` (on a busy machine the wall time is not the work)."""
    times = []
    with torch.inference_mode():
        for i in range(repeats):
            ids = tokenizer(f"Request {i} of run {time.monotonic_ns()}: {text}").input_ids
            engine.add_request(f"prefill-{i}", ids, GenerationParams(max_new_tokens=1))
            if timers is not None:
                timers.reset()
            start, used = time.perf_counter(), time.process_time()
            while engine.has_work():
                engine.step()
            times.append((time.perf_counter() - start) * 1000)
            if cpu is not None:
                cpu.append((time.process_time() - used) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--quantization", default="gguf")
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--prompt-file", type=Path, default=Path(__file__).with_name("prompts") / "tool_prompt.txt")
    parser.add_argument("--prefills", type=int, default=3, help="long-prompt prefills timed (0: none)")
    parser.add_argument("--compile", action="store_true", help="the forward compiled, as --compile (no parts)")
    parser.add_argument("--ops", type=int, default=0, metavar="N", help="also torch.profiler's top N ops a step")
    args = parser.parse_args()
    print(f"{cpu_summary()}; torch threads {torch.get_num_threads()}")
    started = time.perf_counter()
    loaded = load_model(args.model, quantization=args.quantization, attn_implementation=register_attention())
    prepare_forward(loaded.model, compile=args.compile)
    print(f"loaded {args.model} ({args.quantization}) in {time.perf_counter() - started:.1f} s")
    tokenizer = loaded.tokenizer
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"]  # fmt: skip
    rows_list = [int(r) for r in args.rows.split(",")]
    limits = EngineLimits(max_model_len=1024, max_num_seqs=max(rows_list), max_num_batched_tokens=512)
    engine = Engine(loaded.model, tokenizer, [], limits, lambda _: None, torch.device("cpu"))
    if args.compile:  # as the server does before it serves
        started = time.perf_counter()
        warm_up(engine, tokenizer("Warm up the compiled layers.").input_ids)
        print(f"compiled in {time.perf_counter() - started:.1f} s")
    for rows in rows_list:
        print(profile(engine, loaded.model, prompt, rows, args.steps, hooks=not args.compile), flush=True)
        if args.ops:
            print(f"torch.profiler, {args.steps} steps of {rows} rows:")
            print(op_table(engine, prompt, rows, args.steps, args.ops), flush=True)
    if args.prefills:
        text = args.prompt_file.read_text()
        tokens = len(tokenizer(f"Request 0 of run 0: {text}").input_ids)
        cpu: list[float] = []
        times = prefill_ms(engine, tokenizer, text, args.prefills, cpu=cpu)
        shown = ", ".join(f"{t:.0f}" for t in times)
        print(f"prefill of {args.prompt_file.name} ({tokens} tokens) and its first token: median "
              f"{statistics.median(times):.0f} ms ({shown}); CPU time {statistics.median(cpu):.0f} ms")  # fmt: skip
        if args.compile:
            return
        timers = Timers(loaded.model)
        try:
            (hooked,) = prefill_ms(engine, tokenizer, text, 1, timers)
        finally:
            timers.remove()
        spent = {key: value * 1000 for key, value in timers.spent.items()}
        print(f"  with hooks {hooked:.0f} ms: {split(spent, hooked)}")


if __name__ == "__main__":
    main()
