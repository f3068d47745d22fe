"""Operators' view: the Grafana dashboard names only metrics a real /metrics exposes, and
the per-request phase histograms are there beside the latency ones."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "helios-serving.json"
METRIC = re.compile(r"\b((?:helios|flare)_[a-z0-9_]+)")


def _queries(node) -> list[str]:
    """Every PromQL string of a dashboard: panel targets and templating queries."""
    if isinstance(node, dict):
        out = [v for k, v in node.items() if k in ("expr", "definition") and isinstance(v, str)]
        if isinstance(node.get("query"), str):
            out.append(node["query"])
        return out + [q for v in node.values() for q in _queries(v)]
    if isinstance(node, list):
        return [q for v in node for q in _queries(v)]
    return []


def test_every_dashboard_query_names_a_metric_that_exists(tiny_server):
    url = tiny_server.url
    r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "model": tiny_server.settings.served_name, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    samples = {s.name for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)
               for s in f.samples}
    queries = _queries(json.loads(DASHBOARD.read_text()))
    assert len(queries) >= 20
    names = {m for q in queries for m in METRIC.findall(q)}
    assert names and not names - samples, sorted(names - samples)
    for phase in ("queue", "prefill", "decode"):
        assert f"helios_request_{phase}_time_seconds_bucket" in names
