"""Worker processes of the reference app (`faust -A app worker`) for the demo, the tests
and the benchmarks: each with its own data dir, web port and host/rack labels."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.settings import JOIN_NAME
from tables.testing import FAST_GROUP_SETTINGS, WorkerControl, embedded_env, free_port, wait_for

REPO = Path(__file__).resolve().parent.parent
__all__ = ["REPO", "WorkerProcess", "covered", "join_view", "views", "wait_for"]


@dataclass
class WorkerProcess(WorkerControl):
    name: str
    host: str
    rack: str
    bootstrap: str
    app_id: str
    run_dir: Path
    standby_replicas: int = 1
    partitions: int = 6
    topic_prefix: str = ""
    app_module: str = "app"  # what `faust -A` loads (a benchmark swaps the app)
    session_timeout_ms: int = FAST_GROUP_SETTINGS["session_timeout_ms"]
    heartbeat_ms: int = FAST_GROUP_SETTINGS["heartbeat_interval_ms"]
    follower_sync_delay_ms: int = FAST_GROUP_SETTINGS["follower_sync_delay_ms"]
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    cwd: Path | None = REPO
    process: subprocess.Popen[bytes] | None = None
    stopped: bool = False

    def env(self) -> dict[str, str]:
        return {
            **embedded_env(),
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
            # The embedded broker holds JoinGroup for half the session timeout.
            "TANDEM_SESSION_TIMEOUT_MS": str(self.session_timeout_ms),
            "TANDEM_HEARTBEAT_MS": str(self.heartbeat_ms),
            "TANDEM_REQUEST_TIMEOUT_MS": str(FAST_GROUP_SETTINGS["request_timeout_ms"]),
            "TANDEM_FOLLOWER_SYNC_DELAY_MS": str(self.follower_sync_delay_ms),
            **self.extra_env,
        }

    def join(self) -> dict[str, Any] | None:
        """This worker's view of the ad join (None while it does not answer)."""
        return join_view(self.view())


def join_view(view: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if view is None else view["joins"].get(JOIN_NAME)


def views(workers: list[WorkerProcess]) -> dict[str, dict[str, Any] | None]:
    """Each worker's view of the ad join."""
    return {w.name: w.join() for w in workers}


def covered(workers: list[WorkerProcess], partitions: int) -> bool:
    """Every partition is active on exactly one live worker, and restored there."""
    for worker in workers:
        worker.check()
    owners: list[int] = []
    for view in views(workers).values():
        if view is None:
            continue
        owners.extend(view["actives"])
        last = view["last_rebalance"]
        if last["seconds"] is None or view["restoring"]:
            return False  # still restoring
        # The join's own record of its last assignment holds every active: with the cooperative
        # protocol the assignor has the new partitions before the join takes them (after Faust's
        # table recovery), and a takeover not yet taken shows its old record.
        taken = [*last.get("kept", []), *last.get("moved_warm", []), *last.get("moved_cold", [])]
        if sorted(taken) != sorted(view["actives"]):
            return False
    return sorted(owners) == list(range(partitions))
