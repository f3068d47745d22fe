"""The inference gateway's model-server metrics (docs/deploy.md, "Inference-gateway
metrics") read from a loaded server: one request running, one waiting for the only slot."""

from __future__ import annotations

import threading

import httpx
from helios_serve.testing.harness import ScriptedServer, sse_post
from prometheus_client.parser import text_string_to_metric_families

LORA = ("helios_lora_requests_info",
        (("max_lora", "0"), ("running_lora_adapters", ""), ("waiting_lora_adapters", "")))


def _samples(url: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _chat(server: ScriptedServer, text: str) -> dict:
    return {"model": server.model_name, "stream": True, "max_tokens": 40,
            "messages": [{"role": "user", "content": text}]}


def test_the_picker_reads_queued_running_kv_lora_and_cache_info(tok):
    with ScriptedServer(tok, max_active=1, step_delay_s=0.05) as server:
        server.script("long", ["Hello", ","] * 20)
        idle = _samples(server.url)
        assert idle[("helios_requests_running", ())] == 0
        assert idle[("helios_requests_waiting", ())] == 0
        assert idle[("helios_kv_cache_usage_perc", ())] == 0.0
        # block_size = tokens per page, num_gpu_blocks = physical pages (tiny_geometry).
        assert idle[("helios_cache_config_info",
                     (("block_size", "4"), ("num_gpu_blocks", "256")))] == 1
        assert idle[LORA] > 1.7e9  # a Unix time in seconds: when the server started

        results = []
        threads = [threading.Thread(target=lambda: results.append(
            sse_post(server.url, _chat(server, "long please")))) for _ in range(2)]
        for t in threads:
            t.start()
        loaded = None
        for _ in range(400):  # until both are admitted (bounded: each step is 50 ms)
            m = _samples(server.url)
            if m[("helios_requests_running", ())] == 1 and m[("helios_requests_waiting", ())] == 1:
                loaded = m
                break
            threading.Event().wait(0.01)
        assert loaded is not None, "never saw one request running and one waiting"
        used = loaded[("helios_cache_pages_used", ())]
        assert used >= 4  # the rendered prompt alone spans more than 3 pages of 4 tokens
        assert loaded[("helios_kv_cache_usage_perc", ())] == used / 256
        for t in threads:
            t.join()
        assert [status for status, _ in results] == [200, 200]
        server.wait_idle()
        done = _samples(server.url)
        assert done[("helios_requests_running", ())] == 0
        assert done[("helios_requests_waiting", ())] == 0
        assert done[("helios_kv_cache_usage_perc", ())] == 0.0
        assert done[LORA] == idle[LORA]
