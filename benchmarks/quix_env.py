"""Quix Streams in a virtual environment of its own, for the benchmarks that compare with it
(bench_worker.py, bench_enrich.py): quixstreams pins confluent-kafka and rocksdict versions of
its own, so it never enters the project's environment or dependencies.

`quix_python()` makes `benchmarks/out/quix-venv` on first use (pip, about a minute) and returns
its interpreter; `run_quix(config)` runs benchmarks/quix_join.py there and returns its JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

QUIX_VERSION = "3.28.1"
BENCHMARKS = Path(__file__).resolve().parent
VENV = BENCHMARKS / "out" / "quix-venv"


def quix_python() -> Path:
    """The Quix environment's interpreter, made (and quixstreams installed) if missing."""
    python = VENV / "bin" / "python"
    stamp = VENV / f".quixstreams-{QUIX_VERSION}"
    if not stamp.exists():
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"quixstreams=={QUIX_VERSION}", "orjson"], check=True
        )
        stamp.touch()
    return python


def run_quix(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    """benchmarks/quix_join.py with `config`, in its own process; its last line, parsed."""
    done = subprocess.run(
        [str(quix_python()), str(BENCHMARKS / "quix_join.py"), json.dumps(config)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"quix run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
