"""Prometheus metrics with vLLM's names under a ``decoda_`` prefix, so dashboards translate.

Request and token series carry a ``strategy`` label (greedy, sample, beam, ...), which no peer
server offers. The engine reports through ``decoding.telemetry.EngineObserver`` from its worker
thread; prometheus-client objects are thread-safe. Each app gets its own registry so tests (and
several apps in one process) never collide.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from decoding.telemetry import EngineObserver

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 300.0)
ROW_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256)

CONTENT_TYPE = CONTENT_TYPE_LATEST

# (name, meaning) — the README's metrics table is generated from the same words
METRIC_DOCS = {
    "decoda_time_to_first_token_seconds": "arrival to first generated token (histogram; label strategy)",
    "decoda_inter_token_latency_seconds": "gap between consecutive tokens of one sequence (histogram; strategy)",
    "decoda_e2e_request_latency_seconds": "arrival to last token (histogram; strategy)",
    "decoda_request_queue_time_seconds": "arrival to admission into the batch (histogram; strategy)",
    "decoda_num_requests_running": "requests in the running batch (gauge)",
    "decoda_num_requests_waiting": "requests queued for KV blocks, preempted ones included (gauge)",
    "decoda_kv_cache_usage_perc": "fraction of KV blocks held by running requests, 0..1 (gauge)",
    "decoda_prefix_cache_queries_total": "prompt tokens looked up in the prefix cache (counter)",
    "decoda_prefix_cache_hits_total": "prompt tokens the prefix cache supplied (counter)",
    "decoda_num_preemptions_total": "running requests swapped out because KV blocks ran out (counter)",
    "decoda_prompt_tokens_total": "prompt tokens admitted (counter; strategy)",
    "decoda_generation_tokens_total": "tokens generated (counter; strategy)",
    "decoda_request_success_total": "finished requests (counter; finished_reason stop|length|abort|error, strategy)",
    "decoda_batch_rows": "rows per batched forward (histogram)",
    "decoda_spec_draft_tokens_total": "draft tokens proposed (counter; label assistant: a model name, "
    "prompt_lookup or early_exit)",
    "decoda_spec_accepted_tokens_total": "draft tokens the target accepted (counter; assistant)",
    "decoda_spec_acceptance_rate": "accepted / proposed draft tokens since start (gauge; assistant)",
    "decoda_spec_accepted_length": "draft tokens accepted per verification (histogram; assistant); "
    "its mean is the mean accepted length",
    "decoda_structured_output_compiles_total": "structured outputs asked for (counter; label cached: true when "
    "the compiled grammar was reused from the cache, false when it was compiled)",
    "decoda_structured_output_compile_seconds": "time to compile a structured output's grammar, cache misses "
    "only (histogram)",
    "decoda_structured_output_failures_total": "requests whose constraint could not go on, answered with an "
    "error (counter; label reason: error, the grammar's own error state, or budget, its masks over their time "
    "budget)",
    "decoda_lora_requests_info": "LoRA adapters in use, as vLLM's lora_requests_info (gauge, its value the time "
    "of the last change; labels running_lora_adapters and waiting_lora_adapters: comma-separated adapter names "
    "running requests use and waiting ones need, max_lora: --max-loras)",
    "decoda_audio_seconds_total": "seconds of audio transcribed or translated (counter)",
    "decoda_images_encoded_total": "images the vision tower ran on; an image whose tokens the prefix cache "
    "held is not counted (counter)",
    "decoda_vision_encoder_seconds_total": "seconds the vision tower ran (counter)",
    "decoda_transcription_real_time_factor": "a transcription's wall time over its audio's duration, below 1 "
    "faster than real time (histogram)",
    "decoda_http_requests_total": "HTTP responses sent, errors included (counter; labels route: the path "
    "template such as /v1/completions, or unmatched; status: the code, such as 200 or 401)",
}


class Metrics(EngineObserver):
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry

        def doc(name: str) -> str:
            return METRIC_DOCS[name]

        self.ttft = Histogram(
            "decoda_time_to_first_token_seconds", doc("decoda_time_to_first_token_seconds"),
            ["strategy"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            "decoda_inter_token_latency_seconds", doc("decoda_inter_token_latency_seconds"),
            ["strategy"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "decoda_e2e_request_latency_seconds", doc("decoda_e2e_request_latency_seconds"),
            ["strategy"], buckets=E2E_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_time = Histogram(
            "decoda_request_queue_time_seconds", doc("decoda_request_queue_time_seconds"),
            ["strategy"], buckets=E2E_BUCKETS, registry=r,
        )  # fmt: skip
        self.running = Gauge("decoda_num_requests_running", doc("decoda_num_requests_running"), registry=r)
        self.waiting = Gauge("decoda_num_requests_waiting", doc("decoda_num_requests_waiting"), registry=r)
        self.kv_usage = Gauge("decoda_kv_cache_usage_perc", doc("decoda_kv_cache_usage_perc"), registry=r)
        # prometheus-client appends _total to counters itself
        self.prompt_tokens = Counter(
            "decoda_prompt_tokens", doc("decoda_prompt_tokens_total"), ["strategy"], registry=r
        )
        self.generation_tokens = Counter(
            "decoda_generation_tokens", doc("decoda_generation_tokens_total"), ["strategy"], registry=r
        )
        self.success = Counter(
            "decoda_request_success", doc("decoda_request_success_total"),
            ["finished_reason", "strategy"], registry=r,
        )  # fmt: skip
        self.batch_rows = Histogram("decoda_batch_rows", doc("decoda_batch_rows"), buckets=ROW_BUCKETS, registry=r)
        self.spec_drafted = Counter(
            "decoda_spec_draft_tokens", doc("decoda_spec_draft_tokens_total"), ["assistant"], registry=r
        )
        self.spec_accepted = Counter(
            "decoda_spec_accepted_tokens", doc("decoda_spec_accepted_tokens_total"), ["assistant"], registry=r
        )
        self.spec_rate = Gauge(
            "decoda_spec_acceptance_rate", doc("decoda_spec_acceptance_rate"), ["assistant"], registry=r
        )
        self.spec_length = Histogram(
            "decoda_spec_accepted_length", doc("decoda_spec_accepted_length"), ["assistant"],
            buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32), registry=r,
        )  # fmt: skip
        self.prefix_queries = Counter(
            "decoda_prefix_cache_queries", doc("decoda_prefix_cache_queries_total"), registry=r
        )
        self.prefix_hits = Counter("decoda_prefix_cache_hits", doc("decoda_prefix_cache_hits_total"), registry=r)
        self.preemptions = Counter("decoda_num_preemptions", doc("decoda_num_preemptions_total"), registry=r)
        self.http_requests = Counter(
            "decoda_http_requests", doc("decoda_http_requests_total"), ["route", "status"], registry=r
        )
        self.grammar_compiles = Counter(
            "decoda_structured_output_compiles", doc("decoda_structured_output_compiles_total"), ["cached"], registry=r
        )
        self.grammar_seconds = Histogram(
            "decoda_structured_output_compile_seconds", doc("decoda_structured_output_compile_seconds"),
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0), registry=r,
        )  # fmt: skip
        self.grammar_failures = Counter(
            "decoda_structured_output_failures", doc("decoda_structured_output_failures_total"), ["reason"], registry=r
        )
        self.audio_seconds = Counter("decoda_audio_seconds", doc("decoda_audio_seconds_total"), registry=r)
        self.images_encoded = Counter("decoda_images_encoded", doc("decoda_images_encoded_total"), registry=r)
        self.vision_seconds = Counter("decoda_vision_encoder_seconds", doc("decoda_vision_encoder_seconds_total"),
                                      registry=r)  # fmt: skip
        self.real_time_factor = Histogram(
            "decoda_transcription_real_time_factor", doc("decoda_transcription_real_time_factor"),
            buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0), registry=r,
        )  # fmt: skip
        self.lora_info = Gauge(
            "decoda_lora_requests_info", doc("decoda_lora_requests_info"),
            ["running_lora_adapters", "waiting_lora_adapters", "max_lora"], registry=r,
        )  # fmt: skip
        self._lora_labels: tuple[str, str, str] | None = None
        self.cache_config: tuple[int, int, bool] | None = None  # (block_size, num_blocks, prefix caching)
        self._spec_totals: dict[str, list[int]] = {}

    # ---- EngineObserver (worker thread) ------------------------------------------------------------
    def on_admitted(self, strategy: str, queue_seconds: float, num_prompt_tokens: int) -> None:
        self.queue_time.labels(strategy).observe(queue_seconds)
        self.prompt_tokens.labels(strategy).inc(num_prompt_tokens)

    def on_first_token(self, strategy: str, ttft_seconds: float) -> None:
        self.ttft.labels(strategy).observe(ttft_seconds)

    def on_tokens(self, strategy: str, num_tokens: int, inter_token_seconds: list[float]) -> None:
        self.generation_tokens.labels(strategy).inc(num_tokens)
        histogram = self.itl.labels(strategy)
        for gap in inter_token_seconds:
            histogram.observe(gap)

    def on_finished(self, strategy: str, finished_reason: str, e2e_seconds: float) -> None:
        self.success.labels(finished_reason, strategy).inc()
        self.e2e.labels(strategy).observe(e2e_seconds)

    def on_step(self, num_rows: int, num_running: int, num_waiting: int, kv_usage: float) -> None:
        self.batch_rows.observe(num_rows)
        self.running.set(num_running)
        self.waiting.set(num_waiting)
        self.kv_usage.set(kv_usage)

    def on_prefix_cache(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_queries.inc(num_queried_tokens)
        self.prefix_hits.inc(num_hit_tokens)

    def on_preempted(self) -> None:
        self.preemptions.inc()

    def on_speculation(self, proposer: str, num_drafted: int, num_accepted: int) -> None:
        self.spec_drafted.labels(proposer).inc(num_drafted)
        self.spec_accepted.labels(proposer).inc(num_accepted)
        self.spec_length.labels(proposer).observe(num_accepted)
        totals = self._spec_totals.setdefault(proposer, [0, 0])
        totals[0] += num_drafted
        totals[1] += num_accepted
        self.spec_rate.labels(proposer).set(totals[1] / totals[0] if totals[0] else 0.0)

    def on_grammar_compiled(self, cached: bool, seconds: float) -> None:
        self.grammar_compiles.labels("true" if cached else "false").inc()
        if not cached:
            self.grammar_seconds.observe(seconds)

    def on_grammar_failed(self, reason: str) -> None:
        self.grammar_failures.labels(reason).inc()

    def on_transcribed(self, audio_seconds: float, seconds: float) -> None:
        self.audio_seconds.inc(audio_seconds)
        if audio_seconds > 0:
            self.real_time_factor.observe(seconds / audio_seconds)

    def on_images_encoded(self, num_images: int, seconds: float) -> None:
        self.images_encoded.inc(num_images)
        self.vision_seconds.inc(seconds)

    def on_cache_config(self, block_size: int, num_blocks: int, prefix_caching: bool) -> None:
        self.cache_config = (block_size, num_blocks, prefix_caching)

    def on_lora_requests(self, running: list[str], waiting: list[str], max_loras: int) -> None:
        labels = (",".join(running), ",".join(waiting), str(max_loras))
        if labels == self._lora_labels:
            return
        self.lora_info.clear()  # one series: the current adapters (vLLM keeps only the latest too)
        self.lora_info.labels(*labels).set(time.time())
        self._lora_labels = labels

    # ---- HTTP (event loop) -------------------------------------------------------------------------
    def on_response(self, route: str, status: int) -> None:
        self.http_requests.labels(route, str(status)).inc()

    # ---- exposition ------------------------------------------------------------------------------
    def render(self) -> bytes:
        return generate_latest(self.registry)
