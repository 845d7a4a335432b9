"""Quix Streams in a virtual environment of its own, for the benchmarks that compare with it
(bench_worker.py, bench_enrich.py): quixstreams pins confluent-kafka and rocksdict versions of
its own, so it never enters the project's environment or dependencies.

`quix_python()` makes `benchmarks/out/quix-venv` on first use (pip, about a minute) and returns
its interpreter; `run_quix(config)` runs benchmarks/quix_join.py there and returns its JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.peer_env import PeerEnv

QUIX_VERSION = "3.28.1"
QUIX = PeerEnv("quix", f"quixstreams=={QUIX_VERSION}")


def quix_python() -> Path:
    """The Quix environment's interpreter, made (and quixstreams installed) if missing."""
    return QUIX.python()


def run_quix(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    """benchmarks/quix_join.py with `config`, in its own process; its last line, parsed."""
    return QUIX.run("quix_join.py", config, timeout)
