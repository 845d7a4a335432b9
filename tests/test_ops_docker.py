"""docker/: Prometheus scrapes every worker of the compose file; Grafana is provisioned with a
well-formed dashboard whose every query is valid PromQL on metrics Tandem defines.

The live check (every metric the dashboard queries is on a real worker's /metrics) is in
tests/test_ops_live.py. Tools absent here (promtool, docker-compose) skip their test, saying so.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tables.web.metrics import METRICS, exported_names
from tests.ops_checks import (
    DOCKER,
    PROMETHEUS_CONFIG,
    PROMTOOL,
    as_prometheus,
    dashboard,
    label_values_metric,
    metric_names,
    panel_queries,
    variable_queries,
)

COMPOSE = DOCKER / "compose.yaml"
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (apt-get install -y prometheus)"
)


def _compose() -> dict:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def test_prometheus_scrapes_every_worker_of_the_compose_file() -> None:
    services = _compose()["services"]
    workers = sorted(name for name in services if name.startswith("worker-"))
    assert workers, "no worker service in docker/compose.yaml"
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = config["scrape_configs"]
    targets = {t for job in jobs for sc in job["static_configs"] for t in sc["targets"]}
    paths = {job.get("metrics_path", "/metrics") for job in jobs}
    for name in workers:
        port = services[name]["environment"].get("TANDEM_WEB_PORT", "6066")
        assert f"{name}:{port}" in targets, (name, targets)
    assert paths == {"/metrics"}
    # Prometheus and Grafana are services, with their configuration mounted from docker/.
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert any("prometheus.yml:/etc/prometheus/prometheus.yml" in v for v in prometheus["volumes"])
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/tandem.yml").read_text())
    assert mounts["./grafana/dashboards"] == provider["providers"][0]["options"]["path"]


@needs_promtool
def test_promtool_accepts_the_prometheus_config() -> None:
    assert PROMTOOL is not None
    command = [PROMTOOL, "check", "config", str(PROMETHEUS_CONFIG)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_is_well_formed_and_queries_only_tandem_metrics() -> None:
    board = dashboard()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 30
    datasources = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = datasources["datasources"][0]["uid"]
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("records read", "lag", "warm", "restore", "dead letters", "event time to output"):
        assert topic in titles, topic
    for panel in panels:
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
    known = exported_names()
    queried = set().union(*(metric_names(q) for q in panel_queries(board)))
    assert queried and queried <= known, sorted(queried - known)
    for query in variable_queries(board):
        metric, label = label_values_metric(query)
        assert label in METRICS[metric][1]


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule's expression (no server needed)."""
    assert PROMTOOL is not None
    rules = [
        {"record": f"tandem:dashboard_query:{i}", "expr": as_prometheus(q)}
        for i, q in enumerate(panel_queries(dashboard()))
    ]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout, done.stdout


def test_metric_names_of_a_query() -> None:
    """The helper the dashboard checks rely on: metric names, not functions or labels."""
    expr = 'histogram_quantile(0.99, sum by (le) (rate(tandem_x_bucket{join=~"$join"}[5m]))) / max(tandem_y)'
    assert metric_names(expr) == {"tandem_x_bucket", "tandem_y"}
    assert metric_names("sum by (worker, role) (tandem_partitions) * 1000") == {"tandem_partitions"}
