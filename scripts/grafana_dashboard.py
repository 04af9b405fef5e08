#!/usr/bin/env python3
"""Writes deploy/grafana/kvpack-dashboard.json: the Grafana dashboard of a kvpack server's /metrics.

Run from the repository root after changing a panel: python3 scripts/grafana_dashboard.py
The test server_dashboard_test checks that every metric the dashboard queries exists in /metrics.
"""
import json
import os

DS = {"type": "prometheus", "uid": "${datasource}"}
M = 'model_name=~"$model_name"'


def q(expr, legend=""):
    return {"expr": expr, "legendFormat": legend}


def quantiles(metric, by=M):
    return [q(f'histogram_quantile({p}, sum by (le) (rate({metric}_bucket{{{by}}}[$__rate_interval])))', f"p{int(p * 100)}")
            for p in (0.5, 0.9, 0.99)]


ROWS = [
    ("Load", [
        ("Requests running / waiting", "short", [q(f"vllm:num_requests_running{{{M}}}", "running"),
                                                  q(f"vllm:num_requests_waiting{{{M}}}", "waiting")]),
        ("Tokens / s", "short", [q(f"rate(vllm:prompt_tokens_total{{{M}}}[$__rate_interval])", "prompt"),
                                 q(f"rate(vllm:generation_tokens_total{{{M}}}[$__rate_interval])", "generated")]),
        ("Requests finished / s by reason", "reqps",
         [q(f"sum by (finished_reason) (rate(vllm:request_success_total{{{M}}}[$__rate_interval]))", "{{finished_reason}}"),
          q("rate(kvpack_requests_failed_total[$__rate_interval])", "failed")]),
    ]),
    ("Latency", [
        ("Time to first token", "s", quantiles("vllm:time_to_first_token_seconds")),
        ("Inter-token latency", "s", quantiles("vllm:inter_token_latency_seconds")),
        ("End-to-end latency", "s", quantiles("vllm:e2e_request_latency_seconds")),
        ("Queue time", "s", quantiles("vllm:request_queue_time_seconds")),
    ]),
    ("KV memory", [
        ("KV cache usage (running sequences)", "percentunit", [q(f"vllm:kv_cache_usage_perc{{{M}}}", "usage")]),
        ("KV pages by state", "short", [q("kvpack_kv_pages_by_state", "{{state}}")]),
        ("Resident KV bytes", "bytes", [q("kvpack_kv_resident_bytes", "hot pool"),
                                        q("kvpack_kv_cold_used_bytes", "cold tier"),
                                        q("kvpack_kv_cold_digest_bytes", "cold-page digests")]),
        ("Preemptions / s", "short", [q(f"rate(vllm:num_preemptions_total{{{M}}}[$__rate_interval])", "preemptions"),
                                      q("rate(kvpack_kv_swap_outs_total[$__rate_interval])", "swapped out"),
                                      q("rate(kvpack_kv_recomputes_total[$__rate_interval])", "recomputed")]),
    ]),
    ("Prefix cache", [
        ("Prefix-cache hit rate (tokens)", "percentunit",
         [q(f"rate(vllm:prefix_cache_hits_total{{{M}}}[$__rate_interval]) / rate(vllm:prefix_cache_queries_total{{{M}}}[$__rate_interval])", "hit rate")]),
        ("Blocks reused by tier / s", "short",
         [q("sum by (tier) (rate(kvpack_prefix_cache_hit_blocks_by_tier_total[$__rate_interval]))", "{{tier}}"),
          q("rate(kvpack_prefix_cache_spilled_blocks_total[$__rate_interval])", "spilled to cold")]),
    ]),
    ("Compression", [
        ("Evicted tokens / s by policy", "short",
         [q("sum by (policy) (rate(kvpack_kv_evicted_tokens_total[$__rate_interval]))", "{{policy}}")]),
        ("Reclaim efficiency by policy", "percentunit", [q("kvpack_kv_reclaim_efficiency", "{{policy}}")]),
        ("Freed KV bytes / s by policy", "Bps", [q("sum by (policy) (rate(kvpack_kv_freed_bytes_total[$__rate_interval]))", "{{policy}}")]),
        ("Compaction time share", "percentunit",
         [q("sum by (policy) (rate(kvpack_kv_compaction_seconds_total[$__rate_interval]))", "{{policy}}")]),
        ("Recall: pages brought back / s", "short",
         [q("sum by (policy) (rate(kvpack_kv_recall_pages_total[$__rate_interval]))", "{{policy}}")]),
        ("Drift estimate (max seen)", "percentunit", [q("kvpack_kv_drift_max", "{{policy}}")]),
    ]),
    ("Cold tier", [
        ("Cold tier fill", "percentunit", [q("kvpack_kv_cold_used_bytes / kvpack_kv_cold_capacity_bytes", "used / capacity")]),
        ("Swap-in latency", "s", [q(f'histogram_quantile({p}, sum by (le) (rate(kvpack_kv_swap_in_seconds_bucket[$__rate_interval])))', f"p{int(p * 100)}")
                                  for p in (0.5, 0.99)]),
        ("Cold pages / s", "short", [q("rate(kvpack_kv_cold_pages_written_total[$__rate_interval])", "written"),
                                     q("rate(kvpack_kv_cold_pages_read_total[$__rate_interval])", "read"),
                                     q("rate(kvpack_kv_cold_checksum_misses_total[$__rate_interval])", "checksum misses")]),
    ]),
    ("HTTP", [
        ("Responses / s by code", "reqps", [q("sum by (code) (rate(kvpack_http_responses_total[$__rate_interval]))", "{{code}}")]),
        ("Refused / s by reason", "reqps", [q("sum by (reason) (rate(kvpack_http_rejected_total[$__rate_interval]))", "{{reason}}"),
                                            q("sum by (phase) (rate(kvpack_http_timeouts_total[$__rate_interval]))", "timeout {{phase}}")]),
        ("Connections open", "short", [q("kvpack_http_connections_open", "open"), q("kvpack_http_max_connections", "cap")]),
    ]),
]


def dashboard():
    panels, y, pid = [], 0, 1
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "id": pid, "collapsed": False, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}})
        pid += 1
        y += 1
        for i, (ptitle, unit, targets) in enumerate(row):
            w = 24 // min(len(row), 4) if len(row) <= 4 else 8
            x = (i * w) % 24
            if i and x == 0:
                y += 8
            for r, t in enumerate(targets):
                t["refId"] = chr(ord("A") + r)
                t["datasource"] = DS
            panels.append({"type": "timeseries", "title": ptitle, "id": pid, "datasource": DS,
                           "gridPos": {"x": x, "y": y, "w": w, "h": 8}, "targets": targets,
                           "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                           "options": {"legend": {"displayMode": "list", "placement": "bottom"}}})
            pid += 1
        y += 8
    return {
        "title": "kvpack",
        "uid": "kvpack-server",
        "description": "A kvpack server's /metrics: load, latency, KV memory, prefix cache, compression, cold tier, HTTP. "
                       "vllm:* families have vLLM's names; kvpack_* are kvpack's own.",
        "schemaVersion": 39,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "tags": ["kvpack", "llm"],
        "templating": {"list": [
            {"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus"},
            {"type": "query", "name": "model_name", "label": "Model", "datasource": DS, "includeAll": True, "multi": True,
             "query": {"query": "label_values(vllm:num_requests_running, model_name)", "refId": "model"}, "refresh": 2},
        ]},
        "panels": panels,
    }


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = os.path.join(root, "deploy", "grafana", "kvpack-dashboard.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(dashboard(), f, indent=2)
        f.write("\n")
    print(out)


if __name__ == "__main__":
    main()
