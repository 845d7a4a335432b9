"""Real `faust -A <module> worker` processes of an app, for tests and local runs: started with
their own data dir, web port and host label, read through their pages, stopped by pid.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from tables.testing.broker import free_port


class WorkerControl:
    """Start, stop and read one `faust -A <module> worker` process, stopped by its own pid.

    Subclasses (dataclasses) provide `name`, `run_dir`, `port`, `app_module` and `env()`."""

    name: str
    run_dir: Path
    port: int
    app_module: str
    process: subprocess.Popen[bytes] | None = None
    stopped: bool = False  # by us: kill() or stop()
    cwd: Path | None = None  # where `-A module` is found (default: this process's cwd)

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    @property
    def data_dir(self) -> Path:
        return self.run_dir / self.name

    @property
    def log_path(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    def start(self) -> Self:
        self.stopped = False
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "faust", "-A", self.app_module, "worker", "-l", "info"],
            cwd=self.cwd or Path.cwd(),
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env()},
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
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{tail}")

    def get(self, path: str, timeout: float = 2.0) -> Any:
        """The JSON a page of the worker's web server returns, or None while it does not answer."""
        if not self.alive:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as response:
                return json.loads(response.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def view(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The worker's /tandem/ view, or None while it does not answer."""
        found = self.get("/tandem/", timeout)
        return dict(found) if found is not None else None

    def html(self, path: str = "/tandem/html", timeout: float = 2.0) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as response:
            return str(response.read().decode())


@dataclass
class WorkerProcess(WorkerControl):
    """A worker of any app module, with the given environment."""

    name: str
    app_module: str
    run_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    cwd: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    stopped: bool = False

    def env(self) -> dict[str, str]:
        return dict(self.extra_env)


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.5) -> bool:
    """Poll `predicate` until true or `timeout` seconds pass (every wait is bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
