"""``--metrics-compat vllm``: vLLM's series beside Decoda's, as the inference extension's endpoint picker reads them.

The exposition is parsed with prometheus-client's own parser (what a scraper does), never matched as
text. The engine's reports reach the app's ``Metrics`` as the worker sends them (observer calls); the
vLLM series must carry vLLM's names, types and labels (``model_name``, ``engine``; LoRA info with
``running_lora_adapters``, ``waiting_lora_adapters``, ``max_lora`` and a timestamp value) and equal
Decoda's own series summed over ``strategy``. The end-to-end test reads them from a real server.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from server.app import create_app
from server.config.settings import Settings
from server.http.metrics_vllm import COUNTERS, GAUGES, HISTOGRAMS, VLLM_SERIES
from tests.fake_engine import FakeEngineClient

MODEL = "fake-model"
# what the endpoint picker's vllm engine config reads (llm-d-router factories.go, defaultEngineConfigs)
EPP_READS = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
             "vllm:lora_requests_info", "vllm:cache_config_info")  # fmt: skip


def scrape(compat: str, report=None) -> dict:  # noqa: ANN001
    """{family name: family} of one /metrics answer from an app whose engine reported ``report(metrics)``."""
    app = create_app(Settings(metrics_compat=compat), engine_client=FakeEngineClient())
    if report is not None:
        report(app.state.metrics)

    async def get() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            response = await http.get("/metrics")
            assert response.status_code == 200
            return response.text

    return {family.name: family for family in text_string_to_metric_families(asyncio.run(get()))}


def busy_engine(metrics) -> None:  # noqa: ANN001
    """What a worker reports over a few requests of two strategies, LoRA adapters in use."""
    metrics.on_cache_config(16, 4096, True)
    metrics.on_admitted("greedy", 0.02, 30)
    metrics.on_admitted("sample", 0.5, 12)
    metrics.on_first_token("greedy", 0.05)
    metrics.on_first_token("sample", 0.7)
    metrics.on_tokens("greedy", 3, [0.01, 0.02])
    metrics.on_tokens("sample", 2, [0.03])
    metrics.on_finished("greedy", "stop", 0.9)
    metrics.on_finished("sample", "length", 1.8)
    metrics.on_finished("sample", "length", 2.2)
    metrics.on_prefix_cache(42, 32)
    metrics.on_preempted()
    metrics.on_lora_requests(["sql", "chat"], ["poems"], 4)
    metrics.on_step(3, 5, 7, 0.375)


def value(family, sample_name: str, **labels: str) -> float:  # noqa: ANN001
    matching = [s.value for s in family.samples if s.name == sample_name and labels.items() <= s.labels.items()]
    assert matching, f"{sample_name} {labels} not in {family.samples}"
    return sum(matching)


def test_the_endpoint_pickers_series_under_vllms_names_types_and_labels():
    families = scrape("vllm", busy_engine)
    served = {f"{name}_total" if family.type == "counter" else name for name, family in families.items()}
    assert set(VLLM_SERIES) <= served
    for name in EPP_READS:
        assert name in families, name
    expected = {"model_name": MODEL, "engine": "0"}
    for name in GAUGES:
        (sample,) = families[name].samples
        assert families[name].type == "gauge" and sample.labels == expected, name
    assert families["vllm:num_requests_waiting"].samples[0].value == 7
    assert families["vllm:num_requests_running"].samples[0].value == 5
    assert families["vllm:kv_cache_usage_perc"].samples[0].value == 0.375  # a fraction, 0..1, as vLLM's
    for name in COUNTERS:
        assert families[name].type == "counter" and families[name].samples[0].labels == expected, name
    assert value(families["vllm:prompt_tokens"], "vllm:prompt_tokens_total") == 42  # both strategies
    assert value(families["vllm:generation_tokens"], "vllm:generation_tokens_total") == 5
    assert value(families["vllm:prefix_cache_queries"], "vllm:prefix_cache_queries_total") == 42
    assert value(families["vllm:prefix_cache_hits"], "vllm:prefix_cache_hits_total") == 32
    assert value(families["vllm:num_preemptions"], "vllm:num_preemptions_total") == 1
    success = families["vllm:request_success"]
    assert value(success, "vllm:request_success_total", finished_reason="stop", **expected) == 1
    assert value(success, "vllm:request_success_total", finished_reason="length", **expected) == 2


def test_the_histograms_are_decodas_summed_over_strategies():
    families = scrape("vllm", busy_engine)
    pairs = {"vllm:time_to_first_token_seconds": "decoda_time_to_first_token_seconds",
             "vllm:e2e_request_latency_seconds": "decoda_e2e_request_latency_seconds",
             "vllm:inter_token_latency_seconds": "decoda_inter_token_latency_seconds",
             "vllm:request_queue_time_seconds": "decoda_request_queue_time_seconds"}  # fmt: skip
    assert set(pairs) == set(HISTOGRAMS)
    for theirs, ours in pairs.items():
        family = families[theirs]
        assert family.type == "histogram"
        buckets = [s for s in family.samples if s.name == f"{theirs}_bucket"]
        assert {s.labels["model_name"] for s in buckets} == {MODEL} and {s.labels["engine"] for s in buckets} == {"0"}
        for sample in buckets:  # each bucket is the sum of Decoda's per-strategy buckets with the same bound
            assert sample.value == value(families[ours], f"{ours}_bucket", le=sample.labels["le"]), (theirs, sample)
        assert value(family, f"{theirs}_count") == value(families[ours], f"{ours}_count")
        assert value(family, f"{theirs}_sum") == pytest.approx(value(families[ours], f"{ours}_sum"))
    ttft = families["vllm:time_to_first_token_seconds"]
    assert value(ttft, "vllm:time_to_first_token_seconds_bucket", le="0.1") == 1  # greedy's 0.05, not sample's 0.7
    assert value(ttft, "vllm:time_to_first_token_seconds_count") == 2
    assert value(families["vllm:e2e_request_latency_seconds"], "vllm:e2e_request_latency_seconds_count") == 3


def test_lora_info_is_a_timestamped_gauge_with_vllms_three_labels():
    before = time.time()
    families = scrape("vllm", busy_engine)
    (sample,) = families["vllm:lora_requests_info"].samples
    assert families["vllm:lora_requests_info"].type == "gauge"
    assert sample.labels == {"running_lora_adapters": "sql,chat", "waiting_lora_adapters": "poems", "max_lora": "4"}
    # the EPP picks the newest series by its value: the time of the last change
    assert sample.value >= before - 1 and sample.value == families["decoda_lora_requests_info"].samples[0].value


def test_cache_config_info_says_the_block_size_and_the_pools_blocks():
    families = scrape("vllm", busy_engine)
    (sample,) = families["vllm:cache_config_info"].samples
    assert sample.value == 1
    assert sample.labels["block_size"] == "16" and sample.labels["num_gpu_blocks"] == "4096"


def test_no_lora_series_when_no_adapter_is_served_and_no_vllm_series_without_the_flag():
    def plain(metrics) -> None:  # noqa: ANN001
        metrics.on_step(1, 1, 0, 0.1)

    families = scrape("vllm", plain)
    assert "vllm:lora_requests_info" not in families  # as vLLM without --enable-lora
    assert "vllm:num_requests_running" in families
    without = scrape("none", busy_engine)
    assert not [name for name in without if name.startswith("vllm:")]
    assert "decoda_num_requests_waiting" in without  # Decoda's own are served either way


def test_an_unknown_compat_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="metrics_compat must be one of none, vllm"):
        Settings(metrics_compat="sglang").check()


# ---- a real server ------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_a_real_server_serves_the_vllm_series_the_epp_reads(shared_server):
    base = shared_server("--max-model-len", "2048", "--metrics-compat", "vllm")
    client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=10).text)}
    done_before = value(families["vllm:request_success"], "vllm:request_success_total") if (
        "vllm:request_success" in families and families["vllm:request_success"].samples) else 0  # fmt: skip
    model = client.models.list().data[0].id
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4,
                                   temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=10).text)}
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        (sample,) = families[name].samples
        assert sample.labels == {"model_name": model, "engine": "0"}
        assert sample.value == families[name.replace("vllm:", "decoda_")].samples[0].value
    assert 0 <= families["vllm:kv_cache_usage_perc"].samples[0].value <= 1
    (cache,) = families["vllm:cache_config_info"].samples
    assert cache.labels["block_size"] == "16" and int(cache.labels["num_gpu_blocks"]) > 0
    success = families["vllm:request_success"]
    assert value(success, "vllm:request_success_total", finished_reason="length", model_name=model) >= 1
    assert value(success, "vllm:request_success_total") == done_before + 1
    ttft = families["vllm:time_to_first_token_seconds"]
    assert value(ttft, "vllm:time_to_first_token_seconds_count") == value(
        families["decoda_time_to_first_token_seconds"], "decoda_time_to_first_token_seconds_count")  # fmt: skip
