"""Prometheus metrics of every join on this worker, served at `/metrics`.

One `Collector` reads the runtime's own counters when Prometheus scrapes (nothing is
counted twice, and the join's hot path pays nothing for it). The one value that needs an
observation as it happens, the time from a result's event time to its output being
acknowledged, is observed once per partition per batch into `LatencyBuckets` (a bisect
and two additions) and exposed as a histogram at scrape time.

Labels are bounded: `worker` (one value per process), `join` (declared in code), `side`
(left, right), `category` (the dead-letter categories of tables/records/codecs.py), `kind` (a
fixed list per metric), `role` (active, standby, restoring), `reason` (the store damage
reasons of tables/state/store.py), `table` (the app's Faust tables, declared in code) and
`partition` (at most the join's partition count). The largest metric has `joins x partitions`
series per worker. docs/operations.md lists them.

`/metrics` serves prometheus_client's default registry: what the app or Faust registered
there too (for instance Faust's own sensors, `faust.sensors.prometheus`) comes with it.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from faust.types import AppT
from faust.web import Request, Response, View
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tables.runtime.looplag import running_tasks
from tables.runtime.stats import REBALANCE_KINDS, LatencyBuckets
from tables.runtime.task import JoinTask
from tables.runtime.worker import Runtime
from tables.state.store import damage_counts, shared_memory

METRICS_PATH = "/metrics"
# -- the metrics ------------------------------------------------------------------------

# Every metric: name -> (type, labels besides `worker`, help). The collector fills these;
# the docs and the dashboard test read this table.
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "tandem_worker_info": ("gauge", ("host", "rack", "app"), "This worker: 1, with its labels"),
    "tandem_join_info": (
        "gauge",
        ("join", "left", "right", "changelog", "how"),
        "A declared join: 1, with its topics",
    ),
    "tandem_records_read": ("counter", ("join", "side"), "Input records read, per side"),
    "tandem_null_values": ("counter", ("join", "side"), "Input records with a null value (dropped)"),
    "tandem_rekeyed_records": (
        "counter",
        ("join", "side"),
        "A rekeyed input's source records produced to its repartition topic",
    ),
    "tandem_results": ("counter", ("join", "kind"), "Results handed to the handler: joined or unmatched"),
    "tandem_idle_results": (
        "counter",
        ("join",),
        "Results released by an idle partition's clock (the join's idle option)",
    ),
    "tandem_partition_results": (
        "counter",
        ("join", "partition"),
        "Results handed to the handler, per partition",
    ),
    "tandem_dead_letters": (
        "counter",
        ("join", "category"),
        "Records sent to the dead-letter topic, per category",
    ),
    "tandem_dead_letters_skipped": (
        "counter",
        ("join",),
        "Dead letters over the producer's max_request_size even when cut: skipped (logged)",
    ),
    "tandem_late_records": (
        "counter",
        ("join", "partition"),
        "Records dropped as late, per active partition (kept with its state)",
    ),
    "tandem_duplicate_records": (
        "counter",
        ("join", "partition"),
        "Records whose declared id the state already held (a producer's duplicates), per active partition",
    ),
    "tandem_reread_records": (
        "counter",
        ("join", "partition"),
        "Records read again that the state already held (restarts, takeovers, rebalances): skipped",
    ),
    "tandem_held_records": ("gauge", ("join",), "Records held for event-time alignment"),
    "tandem_forced_records": ("counter", ("join",), "Records released before their turn (alignment cap)"),
    "tandem_align_let_go": (
        "counter",
        ("join", "side"),
        "Times an input's wait for event-time order ran out and its partner went on without it",
    ),
    "tandem_batches": ("counter", ("join",), "Batches joined and committed"),
    "tandem_handler_restarts": (
        "counter",
        ("join",),
        "Times the join's handler was restarted after it raised",
    ),
    "tandem_partitions": ("gauge", ("join", "role"), "Partitions of the join on this worker, by role"),
    "tandem_input_lag_records": (
        "gauge",
        ("join", "partition"),
        "Input records not yet read, both inputs, per active partition",
    ),
    "tandem_standby_lag_records": (
        "gauge",
        ("join", "partition"),
        "Changelog records a standby has not applied yet",
    ),
    "tandem_restore_records_restored": (
        "gauge",
        ("join", "partition"),
        "Changelog records applied by the partition's last restore",
    ),
    "tandem_restore_records_to_go": (
        "gauge",
        ("join", "partition"),
        "Changelog records the partition's restore has still to apply",
    ),
    "tandem_restore_seconds": (
        "gauge",
        ("join", "partition"),
        "How long the partition's last restore took (so far)",
    ),
    "tandem_rebalances": ("counter", ("join",), "Assignments this worker's join received"),
    "tandem_rebalance_partitions": (
        "counter",
        ("join", "kind"),
        "Active partitions after each rebalance, by how they came: kept, moved warm, moved cold (summed)",
    ),
    "tandem_last_rebalance_partitions": (
        "gauge",
        ("join", "kind"),
        "The last rebalance on this worker: partitions kept, moved warm, moved cold",
    ),
    "tandem_last_rebalance_replayed_records": (
        "gauge",
        ("join",),
        "Changelog records the last rebalance replayed here",
    ),
    "tandem_last_rebalance_seconds": (
        "gauge",
        ("join",),
        "From the last assignment until every new active was restored",
    ),
    "tandem_group_epoch": ("gauge", (), "Generation of the group's assignment this worker holds"),
    "tandem_group_rebalance_tasks": (
        "gauge",
        ("kind",),
        "The group's last rebalance as the leader planned it: tasks kept, moved warm, moved cold",
    ),
    "tandem_group_plan_seconds": ("gauge", (), "How long the leader took to plan the group's last rebalance"),
    "tandem_state_bytes": (
        "gauge",
        ("join",),
        "Size on disk of the join's RocksDB state (every partition held here)",
    ),
    "tandem_damaged_stores": (
        "counter",
        ("reason",),
        "Damaged state stores set aside (then restored), per reason",
    ),
    "tandem_damaged_faust_stores": (
        "counter",
        ("table", "reason"),
        "Faust table stores set aside (then rebuilt by Faust from their changelogs), per table and reason",
    ),
    "tandem_live_records": (
        "gauge",
        ("join",),
        "Records the join's ready active partitions hold in memory (the windowed join's index)",
    ),
    "tandem_window_index_entries": (
        "gauge",
        ("join",),
        "Entries of the windowed join's index of live records, over its ready active partitions",
    ),
    "tandem_window_index_bytes": (
        "gauge",
        ("join",),
        "Bytes the windowed join's index holds in memory (an estimate; in RocksDB: its read-ahead)",
    ),
    "tandem_global_table_restored": (
        "gauge",
        ("table",),
        "1 once the worker holds the global table read to its end as found at its start",
    ),
    "tandem_global_table_restore_progress": (
        "gauge",
        ("table",),
        "How much of the global table's restore is done, 0 to 1",
    ),
    "tandem_global_table_lag": (
        "gauge",
        ("table",),
        "Records of the global table's topic this worker has not read yet, over its partitions",
    ),
    "tandem_global_table_entries": ("gauge", ("table",), "Keys the worker's copy of the global table holds"),
    "tandem_global_table_bytes": (
        "gauge",
        ("table",),
        "Bytes of the keys and values of the worker's copy of the global table (in RocksDB)",
    ),
    "tandem_event_loop_stall_seconds": (
        "gauge",
        (),
        "The event loop's longest stall in the last 10 s (how late a task asking to wake every 50 ms woke)",
    ),
    "tandem_event_loop_worst_stall_seconds": ("gauge", (), "The event loop's longest stall since the start"),
    "tandem_asyncio_tasks": ("gauge", (), "Tasks on the worker's event loop"),
    "tandem_rocksdb_memory_bytes": (
        "gauge",
        ("kind",),
        "RocksDB memory the join stores share: block_cache (at most 64 MB), memtables (at most 128 MB)",
    ),
    "tandem_join_failed": (
        "gauge",
        ("join",),
        "1 once the join stopped the worker (the reason is in the view)",
    ),
    "tandem_output_latency_seconds": (
        "histogram",
        ("join",),
        "Event time of a partition's latest result in a batch to its output acknowledged",
    ),
}


def exported_names() -> set[str]:
    """Every sample name a worker exports (counters get `_total`, histograms their parts)."""
    names: set[str] = set()
    for name, (kind, _, _) in METRICS.items():
        if kind == "counter":
            names.add(f"{name}_total")
        elif kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


class _Families:
    """One family per metric name, every label list starting with `worker`."""

    def __init__(self, worker: str | None) -> None:
        self.worker = worker
        self.by_name: dict[str, Metric] = {}
        for name, (kind, labels, doc) in METRICS.items():
            if kind == "counter":
                family: Metric = CounterMetricFamily(name, doc, labels=["worker", *labels])
            elif kind == "histogram":
                family = HistogramMetricFamily(name, doc, labels=["worker", *labels])
            else:
                family = GaugeMetricFamily(name, doc, labels=["worker", *labels])
            self.by_name[name] = family

    def add(self, name: str, labels: Iterable[Any], value: float) -> None:
        assert self.worker is not None
        self.by_name[name].add_metric([self.worker, *map(str, labels)], value)  # type: ignore[attr-defined]

    def histogram(self, name: str, labels: Iterable[Any], buckets: LatencyBuckets) -> None:
        assert self.worker is not None
        family = self.by_name[name]
        family.add_metric(  # type: ignore[attr-defined]
            [self.worker, *map(str, labels)], buckets.cumulative(), buckets.total_ms / 1000
        )


class TandemCollector(Collector):
    """Every Tandem runtime of this process, read at scrape time."""

    def __init__(self, runtimes: Iterable[Runtime] | None = None) -> None:
        self._fixed = list(runtimes) if runtimes is not None else None

    def _runtimes(self) -> list[Runtime]:
        return self._fixed if self._fixed is not None else list(_exported)

    def describe(self) -> Iterator[Metric]:
        yield from _Families(None).by_name.values()

    def collect(self) -> Iterator[Metric]:
        runtimes = self._runtimes()
        if not runtimes:
            return
        families = _Families(worker_name(runtimes[0].app))
        for runtime in runtimes:
            _collect_worker(families, runtime)
            for table, reasons in runtime.faust_stores.damage_counts().items():
                for reason, n in reasons.items():
                    families.add("tandem_damaged_faust_stores", [table, reason], n)
        for reason, n in damage_counts().items():
            families.add("tandem_damaged_stores", [reason], n)
        yield from families.by_name.values()


def worker_name(app: AppT) -> str:
    """The worker's name in views and metrics: TANDEM_WORKER, else host:port."""
    settings = getattr(app.assignor, "settings", None)
    host = getattr(settings, "host", "") or ""
    return os.environ.get("TANDEM_WORKER") or f"{host}:{app.conf.web_port}"


def _collect_worker(f: _Families, runtime: Runtime) -> None:
    app = runtime.app
    assignor = app.assignor
    settings = getattr(assignor, "settings", None)
    host, rack = getattr(settings, "host", ""), getattr(settings, "rack", "")
    f.add("tandem_worker_info", [host, rack, app.conf.id], 1)
    f.add("tandem_event_loop_stall_seconds", [], runtime.loop_lag.longest())
    f.add("tandem_event_loop_worst_stall_seconds", [], runtime.loop_lag.worst)
    tasks = running_tasks()
    if tasks is not None:
        f.add("tandem_asyncio_tasks", [], tasks)
    for kind, n in shared_memory().items():
        f.add("tandem_rocksdb_memory_bytes", [kind], n)
    f.add("tandem_group_epoch", [], float(getattr(assignor, "epoch", 0) or 0))
    info = getattr(assignor, "last_rebalance", None)
    if info is not None:
        stats = info.stats
        for kind in REBALANCE_KINDS:
            f.add("tandem_group_rebalance_tasks", [kind], getattr(stats, kind))
        f.add("tandem_group_plan_seconds", [], stats.plan_ms / 1000)
    for name, task in sorted(runtime.tasks.items()):
        _collect_join(f, name, task, runtime.data_dir / name)
    for topic, table in sorted(runtime.global_tables.items()):
        status = table.status()
        f.add("tandem_global_table_restored", [topic], float(status["restored"]))
        f.add("tandem_global_table_restore_progress", [topic], status["restore_progress"])
        if status["lag"] is not None:
            f.add("tandem_global_table_lag", [topic], status["lag"])
        f.add("tandem_global_table_entries", [topic], status["entries"])
        f.add("tandem_global_table_bytes", [topic], status["bytes"])


def _collect_join(f: _Families, name: str, task: JoinTask, state_dir: Path) -> None:
    spec, stats, state = task.spec, task.stats, task.state
    left, right = spec.left.name, spec.right.name
    f.add("tandem_join_info", [name, left, right, spec.changelog_topic, spec.kind.how], 1)
    for side in ("left", "right"):
        f.add("tandem_records_read", [name, side], stats.read[side])
        f.add("tandem_null_values", [name, side], stats.null_values[side])
        f.add("tandem_rekeyed_records", [name, side], stats.rekeyed[side])
    f.add("tandem_results", [name, "joined"], stats.results - stats.unmatched)
    f.add("tandem_results", [name, "unmatched"], stats.unmatched)
    f.add("tandem_idle_results", [name], stats.idle_results)
    for partition, n in sorted(stats.results_by_partition.items()):
        f.add("tandem_partition_results", [name, partition], n)
    for category, n in stats.dead_letters.items():
        f.add("tandem_dead_letters", [name, category], n)
    f.add("tandem_dead_letters_skipped", [name], stats.letters_skipped)
    held = task.input_snapshot()
    f.add("tandem_held_records", [name], held.held)
    if held.live_records is not None:
        f.add("tandem_live_records", [name], held.live_records)
    f.add("tandem_forced_records", [name], held.forced)
    for side, n in held.let_go.items():
        f.add("tandem_align_let_go", [name, side], n)
    if held.window_index is not None:
        f.add("tandem_window_index_entries", [name], held.window_index["entries"])
        f.add("tandem_window_index_bytes", [name], held.window_index["bytes"])
    f.add("tandem_batches", [name], stats.batches)
    f.add("tandem_handler_restarts", [name], stats.handler_restarts)
    f.add("tandem_join_failed", [name], 1 if stats.failure else 0)
    f.add("tandem_rebalances", [name], task.rebalances)
    rebalance = task.rebalance
    for kind in REBALANCE_KINDS:
        f.add("tandem_rebalance_partitions", [name, kind], stats.rebalance_partitions[kind])
        f.add("tandem_last_rebalance_partitions", [name, kind], len(getattr(rebalance, kind)))
    f.add("tandem_last_rebalance_replayed_records", [name], sum(rebalance.replayed.values()))
    if rebalance.seconds is not None:
        f.add("tandem_last_rebalance_seconds", [name], rebalance.seconds)
    f.histogram("tandem_output_latency_seconds", [name], stats.latency)
    f.add("tandem_state_bytes", [name], directory_bytes(state_dir))
    if state is None:
        return
    actives, standbys, restoring = state.actives(), state.standbys(), state.restoring()
    for role, partitions in (("active", actives), ("standby", standbys), ("restoring", restoring)):
        f.add("tandem_partitions", [name, role], len(partitions))
    for partition in actives:
        lag = task.input_lag(partition)
        if lag is not None:
            f.add("tandem_input_lag_records", [name, partition], lag)
        if partition in state.ready:
            counts = state.active(partition).operator.counters()
            f.add("tandem_late_records", [name, partition], counts.get("late", 0))
            f.add("tandem_duplicate_records", [name, partition], counts.get("duplicates", 0))
        f.add("tandem_reread_records", [name, partition], task.stats.rereads.get(partition, 0))
        progress = state.recovery.progress.get(partition)
        if progress is not None:
            f.add("tandem_restore_records_restored", [name, partition], progress.restored)
            to_go = progress.to_go
            f.add("tandem_restore_records_to_go", [name, partition], math.nan if to_go is None else to_go)
            f.add("tandem_restore_seconds", [name, partition], progress.seconds)
    for partition, lag in sorted(state.recovery.standby_lag.items()):
        if partition in standbys:
            f.add("tandem_standby_lag_records", [name, partition], lag)


def directory_bytes(root: Path) -> int:
    """Bytes of the files under `root` (0 when it does not exist); never raises."""
    total = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                total += directory_bytes(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total


# -- serving ---------------------------------------------------------------------------------

# The runtimes whose metrics this process exports (one per app with joins).
_exported: weakref.WeakSet[Runtime] = weakref.WeakSet()
_registered = False


def register_collector(runtime: Runtime) -> None:
    """Export `runtime`'s metrics: the Tandem collector in prometheus_client's default
    registry (once a process) reads every runtime registered here."""
    global _registered
    _exported.add(runtime)
    if not _registered:
        REGISTRY.register(TandemCollector())
        _registered = True


def register_metrics_page(app: AppT, runtime: Runtime) -> None:
    """`/metrics` on the app's web server, unless the app serves one already (Faust's
    `setup_prometheus_sensors` does, from the same default registry)."""
    register_collector(runtime)
    if METRICS_PATH in app.web.views:
        return

    @app.page(METRICS_PATH, name="tandem-metrics")
    async def metrics(web: View, request: Request) -> Response:
        body = generate_latest(REGISTRY)
        # The 0.0.4 text format: what every Prometheus 2.x parses (1.0.0 is newer).
        return web.bytes(body, headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})
