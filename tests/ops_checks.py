"""Helpers of the operations tests: the dashboard's queries, Prometheus text, headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "docker"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "tandem.json"
PROMETHEUS_CONFIG = DOCKER / "prometheus" / "prometheus.yml"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PROMTOOL = shutil.which("promtool")
# What Grafana puts in for its variables before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$join": ".*"}
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or"}


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panel_queries(board: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard's panels."""
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def variable_queries(board: dict[str, Any]) -> list[str]:
    return [v["definition"] for v in board.get("templating", {}).get("list", []) if v.get("definition")]


def as_prometheus(expr: str) -> str:
    """A panel's expression with Grafana's variables replaced, as Prometheus receives it."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers that are not functions (followed
    by '('), keywords, label names (in by/without/on lists and {...} matchers) or numbers."""
    text = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", text)  # grouping labels
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in _KEYWORDS:
            continue
        names.add(match.group())
    return names


def label_values_metric(query: str) -> tuple[str, str]:
    """`label_values(metric, label)` -> (metric, label)."""
    found = re.fullmatch(r"label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)", query.strip())
    assert found, query
    return found.group(1), found.group(2)


def exposition(text: str) -> dict[str, Any]:
    """Sample names, family names and samples of a /metrics page (Prometheus text format)."""
    samples: dict[str, list[Any]] = {}
    families = set()
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return {"families": families, "samples": samples}


def chromium(url: str, profile: Path, *args: str, timeout: float = 60) -> str:
    """Run headless Chromium (Debian's) on `url`; its stdout."""
    assert CHROMIUM is not None
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--hide-scrollbars", f"--user-data-dir={profile}", *args, url,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG file (from its IHDR chunk); raises if it is not one."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", "not a PNG file"
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


class GridCells(HTMLParser):
    """The group page's grid cells (data-join, data-partition, data-worker, data-role), the
    page's visible text, and its SVG polylines."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, int, str], str] = {}
        self.text: list[str] = []
        self.polylines = 0
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "td" and "data-role" in found:
            key = (str(found["data-join"]), int(str(found["data-partition"])), str(found["data-worker"]))
            self.cells[key] = str(found["data-role"])
        if tag == "polyline":
            self.polylines += 1
        if tag in ("style", "script", "title"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "script", "title"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.text.append(data.strip())
