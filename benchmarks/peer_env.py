"""A peer framework in a virtual environment of its own, for the benchmarks that compare with
it (Quix Streams: quix_env.py; Bytewax: bytewax_env.py): each pins client and state libraries
of its own (confluent-kafka, rocksdict), so none enters the project's environment or
dependencies.

A `PeerEnv` makes `benchmarks/out/<name>-venv` on first use (pip, about a minute) and runs one
of the peer's scripts there: the script takes its JSON config as its argument and prints its
result as one JSON line, its last.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class PeerEnv:
    """`name`'s environment: `requirement` (pinned) and `extras` installed with pip."""

    name: str
    requirement: str  # e.g. "quixstreams==3.28.1", "bytewax[kafka]==0.21.1"
    extras: tuple[str, ...] = ("orjson",)

    @property
    def venv(self) -> Path:
        return BENCHMARKS / "out" / f"{self.name}-venv"

    def python(self) -> Path:
        """The environment's interpreter, made (and the peer installed) if missing."""
        python = self.venv / "bin" / "python"
        stamp = self.venv / f".{self.requirement.replace('==', '-')}"  # installed
        if not stamp.exists():
            if not python.exists():
                subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
            pip = [str(python), "-m", "pip", "install", "-q"]
            subprocess.run([*pip, self.requirement, *self.extras], check=True)
            stamp.touch()
        return python

    def run(self, script: str, config: dict[str, Any], timeout: float) -> dict[str, Any]:
        """benchmarks/`script` with `config`, in its own process; its last line, parsed."""
        done = subprocess.run(
            [str(self.python()), str(BENCHMARKS / script), json.dumps(config)],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not done.stdout.strip():
            raise RuntimeError(f"{self.name} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result
