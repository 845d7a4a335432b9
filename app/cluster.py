"""Worker processes (`faust -A app worker`) for the demo, the tests and the benchmark.

Each worker is a real process with its own data dir, web port and host/rack
labels; it is stopped by its own process id, never by name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.broker import FAST_GROUP_SETTINGS, free_port

REPO = Path(__file__).resolve().parent.parent


@dataclass
class WorkerProcess:
    name: str
    host: str
    rack: str
    bootstrap: str
    app_id: str
    run_dir: Path
    standby_replicas: int = 1
    partitions: int = 6
    topic_prefix: str = ""
    assignor: str = "tandem"
    state: str = "tables"
    app_module: str = "app"  # what `faust -A` loads (a benchmark swaps the join body)
    session_timeout_ms: int = FAST_GROUP_SETTINGS["session_timeout_ms"]
    heartbeat_ms: int = FAST_GROUP_SETTINGS["heartbeat_interval_ms"]
    follower_sync_delay_ms: int = FAST_GROUP_SETTINGS["follower_sync_delay_ms"]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    stopped: bool = False  # by us: kill() or stop()

    @property
    def data_dir(self) -> Path:
        return self.run_dir / self.name

    @property
    def log_path(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "TANDEM_BROKER": f"kafka://{self.bootstrap}",
            "TANDEM_APP_ID": self.app_id,
            "TANDEM_DATA_DIR": str(self.data_dir),
            "TANDEM_WEB_PORT": str(self.port),
            "TANDEM_WEB_BIND": "127.0.0.1",
            "TANDEM_STANDBY_REPLICAS": str(self.standby_replicas),
            "TANDEM_WORKER": self.name,
            "TANDEM_HOST": self.host,
            "TANDEM_RACK": self.rack,
            "TANDEM_PARTITIONS": str(self.partitions),
            "TANDEM_TOPIC_PREFIX": self.topic_prefix,
            "TANDEM_ASSIGNOR": self.assignor,
            "TANDEM_STATE": self.state,
            # The embedded broker holds JoinGroup for half the session timeout.
            "TANDEM_SESSION_TIMEOUT_MS": str(self.session_timeout_ms),
            "TANDEM_HEARTBEAT_MS": str(self.heartbeat_ms),
            "TANDEM_REQUEST_TIMEOUT_MS": str(FAST_GROUP_SETTINGS["request_timeout_ms"]),
            "TANDEM_FETCH_MAX_WAIT_MS": str(FAST_GROUP_SETTINGS["fetch_max_wait_ms"]),
            "TANDEM_FOLLOWER_SYNC_DELAY_MS": str(self.follower_sync_delay_ms),
        }

    def start(self) -> WorkerProcess:
        self.stopped = False
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "faust", "-A", self.app_module, "worker", "-l", "info"],
            cwd=REPO,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no goodbye to the group, no flush."""
        self.stopped = True
        if self.alive:
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> None:
        """Clean stop (SIGTERM), SIGKILL if it lingers past `timeout`."""
        self.stopped = True
        if not self.alive:
            return
        assert self.process is not None
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def check(self) -> None:
        """Raise, with the end of its log, if the worker exited without being stopped."""
        if self.process is not None and not self.stopped and self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{tail}")

    def view(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The worker's JSON view, or None while it does not answer."""
        if not self.alive:
            return None
        url = f"http://127.0.0.1:{self.port}/tandem/"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return dict(json.loads(response.read()))
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def html(self, timeout: float = 2.0) -> str:
        url = f"http://127.0.0.1:{self.port}/tandem/html"
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode())


def views(workers: list[WorkerProcess]) -> dict[str, dict[str, Any] | None]:
    return {w.name: w.view() for w in workers}


def covered(workers: list[WorkerProcess], partitions: int) -> bool:
    """Every partition is active on exactly one live worker, and restored there."""
    for worker in workers:
        worker.check()
    owners: list[int] = []
    for view in views(workers).values():
        if view is None:
            continue
        owners.extend(view["actives"])
        if view["last_rebalance"]["seconds"] is None:
            return False  # still restoring
    return sorted(owners) == list(range(partitions))


def wait_for(predicate: Any, timeout: float, interval: float = 0.5) -> bool:
    """Poll `predicate` until true or `timeout` seconds pass (every wait is bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
