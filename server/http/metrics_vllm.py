"""``--metrics-compat vllm``: the engine's series once more, under vLLM's names, labels and meaning.

Routers built for vLLM read its series by name. The Gateway API Inference Extension's endpoint
picker (llm-d-router's EPP; its model-server protocol, kubernetes-sigs/gateway-api-inference-extension
``docs/proposals/003-model-server-protocol``) scores replicas by queue depth
(``vllm:num_requests_waiting``), running requests (``vllm:num_requests_running``), KV use
(``vllm:kv_cache_usage_perc``, 0..1), LoRA residency (``vllm:lora_requests_info``) and sizes its
prefix index by ``vllm:cache_config_info``; KServe, vLLM's production-stack router and dashboards
made for vLLM read the same names and its latency histograms.

The series are computed at scrape time from Decoda's own (``server.http.metrics``): nothing more is
counted per token, and the two sets cannot disagree. As vLLM's (``vllm/v1/metrics/loggers.py``), each
carries ``model_name`` (the served name) and ``engine`` ("0": one engine per process), except
``vllm:lora_requests_info``, which carries vLLM's three labels only and, as vLLM's, the time of its
last change as its value. Histograms are Decoda's summed over ``strategy``, with Decoda's buckets: a
quantile over them means what one over vLLM's means.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from server.http.metrics import Metrics

ENGINE = "0"
LABELS = ["model_name", "engine"]

# vLLM's name -> (Decoda's name, vLLM's meaning); the README's table says the same
GAUGES = {
    "vllm:num_requests_running": ("decoda_num_requests_running", "Number of requests in model execution batches."),
    "vllm:num_requests_waiting": ("decoda_num_requests_waiting", "Number of requests waiting to be processed."),
    "vllm:kv_cache_usage_perc": ("decoda_kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
}
COUNTERS = {
    "vllm:prefix_cache_queries": ("decoda_prefix_cache_queries",
                                  "Prefix cache queries, in terms of number of queried tokens."),
    "vllm:prefix_cache_hits": ("decoda_prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    "vllm:num_preemptions": ("decoda_num_preemptions", "Cumulative number of preemption from the engine."),
    "vllm:prompt_tokens": ("decoda_prompt_tokens", "Number of prefill tokens processed."),
    "vllm:generation_tokens": ("decoda_generation_tokens", "Number of generation tokens processed."),
}  # fmt: skip
SUCCESS = ("vllm:request_success", "decoda_request_success", "Count of successfully processed requests.")
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": ("decoda_time_to_first_token_seconds",
                                         "Histogram of time to first token in seconds."),
    "vllm:inter_token_latency_seconds": ("decoda_inter_token_latency_seconds",
                                         "Histogram of inter-token latency in seconds."),
    "vllm:e2e_request_latency_seconds": ("decoda_e2e_request_latency_seconds",
                                         "Histogram of e2e request latency in seconds."),
    "vllm:request_queue_time_seconds": ("decoda_request_queue_time_seconds",
                                        "Histogram of time spent in WAITING phase for request."),
}  # fmt: skip
LORA_INFO = ("vllm:lora_requests_info", "decoda_lora_requests_info", "Running stats on lora requests.")
CACHE_INFO = ("vllm:cache_config_info", "Information of the LLMEngine CacheConfig")

# every series this module serves, as a scrape names it (counters with _total)
VLLM_SERIES = (
    *GAUGES, *(f"{name}_total" for name in COUNTERS), f"{SUCCESS[0]}_total", *HISTOGRAMS, LORA_INFO[0], CACHE_INFO[0]
)  # fmt: skip


Samples = dict[str, list[tuple[str, dict[str, str], float]]]


def decoda_samples(metrics: Metrics) -> Samples:
    """Decoda's samples by family (a series' name without its suffixes), read from its metric objects
    themselves: the registry would collect this collector too."""
    found: Samples = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            for family in value.collect():
                found[family.name] = [(s.name, s.labels, s.value) for s in family.samples]
    return found


class VllmCompat(Collector):
    """A prometheus-client collector for ``metrics.registry``: vLLM's series from Decoda's at each scrape.
    ``model_name``: the served name, None while the model loads (nothing is served until then)."""

    def __init__(self, metrics: Metrics, model_name: Callable[[], str | None]) -> None:
        self.metrics = metrics
        self.model_name = model_name

    def describe(self) -> list[Metric]:
        return []  # names known only at scrape time: the registry must not collect() at register

    def collect(self) -> Iterator[Metric]:
        model = self.model_name()
        if model is None:
            return
        labels = [model, ENGINE]
        samples = decoda_samples(self.metrics)
        for name, (ours, doc) in GAUGES.items():
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            family.add_metric(labels, sum(value for _, _, value in samples.get(ours, [])))
            yield family
        for name, (ours, doc) in COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=LABELS)
            family.add_metric(labels, sum(v for sample, _, v in samples.get(ours, []) if sample.endswith("_total")))
            yield family
        yield self._success(samples, labels)
        for name, (ours, doc) in HISTOGRAMS.items():
            yield self._histogram(samples, name, ours, doc, labels)
        lora = self._lora_info(samples)
        if lora is not None:
            yield lora
        cache = self._cache_info()
        if cache is not None:
            yield cache

    def _success(self, samples: Samples, labels: list[str]) -> Metric:
        name, ours, doc = SUCCESS
        by_reason: dict[str, float] = defaultdict(float)
        for sample, sample_labels, value in samples.get(ours, []):
            if sample.endswith("_total"):
                by_reason[sample_labels["finished_reason"]] += value
        family = CounterMetricFamily(name, doc, labels=[*LABELS, "finished_reason"])
        for reason, value in sorted(by_reason.items()):
            family.add_metric([*labels, reason], value)
        return family

    def _histogram(self, samples: Samples, name: str, ours: str, doc: str, labels: list[str]) -> Metric:
        buckets: dict[str, float] = defaultdict(float)
        total = 0.0
        for sample, sample_labels, value in samples.get(ours, []):
            if sample.endswith("_bucket"):
                buckets[sample_labels["le"]] += value
            elif sample.endswith("_sum"):
                total += value
        family = HistogramMetricFamily(name, doc, labels=LABELS)
        if buckets:  # a histogram no strategy has observed yet has no series in Decoda's either
            family.add_metric(labels, sorted(buckets.items(), key=lambda item: float(item[0])), total)
        return family

    def _lora_info(self, samples: Samples) -> Metric | None:
        name, ours, doc = LORA_INFO
        series = [(labels, value) for sample, labels, value in samples.get(ours, []) if sample == ours]
        if not series:
            return None  # no LoRA served: vLLM has no such series either without --enable-lora
        family = GaugeMetricFamily(name, doc, labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"])
        for labels, value in series:
            family.add_metric([labels["max_lora"], labels["waiting_lora_adapters"], labels["running_lora_adapters"]],
                              value)  # fmt: skip
        return family

    def _cache_info(self) -> Metric | None:
        if self.metrics.cache_config is None:
            return None
        block_size, num_blocks, prefix_caching = self.metrics.cache_config
        name, doc = CACHE_INFO
        names = ["block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"]
        family = GaugeMetricFamily(name, doc, labels=names)
        family.add_metric([str(block_size), str(num_blocks), str(prefix_caching), ENGINE], 1.0)
        return family
