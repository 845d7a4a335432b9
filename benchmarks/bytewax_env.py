"""Bytewax (a Rust core under a Python API) in a virtual environment of its own, for
bench_worker.py: bytewax's Kafka connector pins its own confluent-kafka, so it never enters the project's
environment or dependencies.

`run_bytewax(config)` makes `benchmarks/out/bytewax-venv` on first use (pip, about a minute),
runs benchmarks/bytewax_join.py there and returns its JSON.
"""

from __future__ import annotations

from typing import Any

from benchmarks.peer_env import PeerEnv

BYTEWAX_VERSION = "0.21.1"
BYTEWAX = PeerEnv("bytewax", f"bytewax[kafka]=={BYTEWAX_VERSION}")  # [kafka]: its Kafka connector


def run_bytewax(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    """benchmarks/bytewax_join.py with `config`, in its own process; its last line, parsed."""
    return BYTEWAX.run("bytewax_join.py", config, timeout)
