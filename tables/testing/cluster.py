"""Workers of your own app on the embedded broker, on one machine: for trying a join locally
(`python -m tables.dev APP --workers 2`) and for your own integration tests.

    from tables.testing import LocalCluster

    with LocalCluster("paid", count=2, standbys=1) as cluster:     # broker, topics, workers
        cluster.wait_ready()                                       # every partition owned, restored
        ... produce to cluster.bootstrap ...
        cluster.wait_caught_up()                                   # every input record taken
        cluster.workers[0].view()                                  # a worker's /tandem/ view

Each worker is a `faust -A APP worker` process with its own data dir, web port (its pages
at http://127.0.0.1:PORT/tandem/), host label and name, the embedded broker's group
timings (docs/embedded-broker.md), and Faust's settings from the environment, which win over
the app's own (`BROKER_URL`, `WEB_PORT`, `WEB_HOST`, `APP_DATADIR`, `TABLE_STANDBY_REPLICAS`):
the app needs no change to run here. Before any worker starts, the joins' topics are
created with their partition count, so that nothing creates them by reading them first
(a broker that auto-creates topics would give them its default count). Everything is
stopped by its process id.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import faust

from tables.api import runtime_of
from tables.kafka.topics import Topic, create_topics
from tables.runtime.startup import join_topics
from tables.spec import JoinSpec
from tables.testing.broker import EmbeddedBroker, embedded_env, free_port
from tables.testing.workers import WorkerProcess, wait_for


def app_of(module: str) -> faust.App:
    """The Faust app a module defines (`faust -A module`: the `app` attribute, or its only
    faust.App), imported here without starting anything."""
    name, _, attribute = module.partition(":")
    found = importlib.import_module(name)
    if attribute:
        return getattr(found, attribute)
    if isinstance(getattr(found, "app", None), faust.App):
        return found.app
    apps = [value for value in vars(found).values() if isinstance(value, faust.App)]
    if len(apps) != 1:
        raise ValueError(
            f"module {name!r} defines {len(apps)} faust.App objects: name one as {name}:ATTRIBUTE"
        )
    return apps[0]


def joins_of(app: faust.App) -> list[JoinSpec]:
    """The joins an app declares (importing its module declared them)."""
    return runtime_of(app).specs()


@dataclass
class LocalCluster:
    """The embedded broker and `count` worker processes of the app module `app`."""

    app: str
    count: int = 1  # worker processes to start
    standbys: int = 0
    partitions: int | None = None  # the joins' partition count (default: declared, else the app's)
    run_dir: Path | None = None
    cwd: Path | None = None  # where `-A app` is found (default: this process's cwd)
    env: dict[str, str] = field(default_factory=dict)  # for every worker, over the cluster's own
    broker: EmbeddedBroker = field(init=False)
    workers: list[WorkerProcess] = field(default_factory=list, init=False)
    specs: list[JoinSpec] = field(default_factory=list, init=False)

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def start(self) -> LocalCluster:
        if self.cwd is not None and str(self.cwd) not in sys.path:
            sys.path.insert(0, str(self.cwd))
        self.specs = joins_of(app_of(self.app))
        self.run_dir = self.run_dir or Path(tempfile.mkdtemp(prefix="tandem-local-"))
        self.broker = EmbeddedBroker(log_dir=self.run_dir).start()
        asyncio.run(self._create_topics())
        for number in range(1, self.count + 1):
            self.add_worker(f"worker-{number}")
        return self

    def add_worker(self, name: str) -> WorkerProcess:
        """Start one more worker (a scale-out), on a port of its own."""
        assert self.run_dir is not None, "start the cluster first"
        port = free_port()
        env = {
            **embedded_env(),
            "BROKER_URL": f"kafka://{self.bootstrap}",
            "WEB_PORT": str(port),
            "WEB_BIND": "127.0.0.1",
            "WEB_HOST": "127.0.0.1",
            "APP_DATADIR": str(self.run_dir / name),
            "TABLE_STANDBY_REPLICAS": str(self.standbys),
            "TANDEM_STANDBY_REPLICAS": str(self.standbys),
            "TANDEM_HOST": name,  # one host label each: standbys go to another worker
            "TANDEM_WORKER": name,
            **self.env,
        }
        worker = WorkerProcess(name, self.app, self.run_dir, env, port=port, cwd=self.cwd)
        self.workers.append(worker.start())
        return worker

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive]

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every partition of every join is owned by one live worker and restored.
        Raises with the end of a worker's log if one exits, or TimeoutError."""
        if not wait_for(self._ready, timeout):
            raise TimeoutError(
                f"the joins were not owned and restored within {timeout} s; logs in {self.run_dir}"
            )

    def wait_caught_up(self, timeout: float = 120.0) -> None:
        """Until every worker has taken every input record there is (input lag 0 everywhere)."""
        if not wait_for(lambda: self._ready() and self._caught_up(), timeout):
            raise TimeoutError(f"the workers did not catch up within {timeout} s; logs in {self.run_dir}")

    def pages(self) -> list[str]:
        """Each worker's pages, for people."""
        lines = []
        for worker in self.workers:
            base = f"http://127.0.0.1:{worker.port}"
            lines.append(f"{worker.name}: {base}/tandem/html  {base}/tandem/group  {base}/metrics")
        return lines

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.broker.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- inside ---------------------------------------------------------------------------------

    async def _create_topics(self) -> None:
        for spec in self.specs:
            declared = [s.topic.partitions for s in (spec.left, spec.right) if s.topic.partitions]
            count = self.partitions or (declared[0] if declared else spec.app.conf.topic_partitions)
            topics = join_topics(spec, int(count))
            # A rekeyed input's source topic: its own declared count, else the join's.
            sources = {r.source.name: r.source.topic.partitions or int(count) for r in spec.repartitions}
            if spec.is_global:  # a global table keeps its own partition count
                table = spec.right.topic.partitions or spec.app.conf.topic_partitions
                topics.append(Topic(spec.right.name, int(table)))
            await create_topics(
                self.bootstrap,
                {**sources, **{t.name: t.partitions for t in topics}},
                {t.name: dict(t.configs) for t in topics},
            )

    def _views(self) -> list[dict[str, Any]]:
        views = []
        for worker in self.workers:
            worker.check()  # a worker that exited fails now, with its log
            if worker.alive:
                view = worker.view(timeout=5)
                if view is None:
                    return []
                views.append(view)
        return views

    def _ready(self) -> bool:
        views = self._views()
        if not views:
            return False
        for spec in self.specs:
            joins = [v["joins"].get(spec.name) for v in views]
            if any(j is None or j["restoring"] for j in joins):
                return False
            owned = sorted(p for j in joins for p in j["actives"])
            count = next((j["partitions"] for j in joins if j and j["partitions"]), None)
            if count is None or owned != list(range(count)):
                return False
        return True

    def _caught_up(self) -> bool:
        views = self._views()
        lags = [lag for v in views for j in v["joins"].values() for lag in j["lag"].values()]
        return bool(views) and all(lag == 0 for lag in lags)
