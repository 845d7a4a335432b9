"""One way to build a SparkSession for the pipeline jobs (see /work/shared/spark-notes.md)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO_ROOT = Path(__file__).resolve().parent.parent

# Serial GC and the C1 compiler only: a short-lived local JVM starts seconds faster.
FAST_JVM = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


def _python_env() -> None:
    """Workers must run this interpreter and import this repository's packages, and the user's
    app module (`--app`) from where the command runs, as `faust -A` finds it."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    missing = [p for p in (str(REPO_ROOT), os.getcwd()) if p not in paths]
    if missing:
        os.environ["PYTHONPATH"] = os.pathsep.join([*dict.fromkeys(missing), *paths])


def session(
    master: str = "local[*]",
    app_name: str = "tandem-pipeline",
    shuffle_partitions: int | None = None,
    ui: bool = False,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """A SparkSession set up for this machine, with the topic data source registered."""
    _python_env()
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", str(ui).lower())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", FAST_JVM)
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
        .config("spark.sql.session.timeZone", "UTC")
        # Topic names are strings, even in a Parquet directory `topic=2024/`.
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        # Local mode runs everything in the driver JVM; 1 GiB (Spark's default) spills early.
        .config("spark.driver.memory", os.environ.get("TANDEM_DRIVER_MEMORY", "4g"))
    )
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from pipeline.source import TopicDataSource

    spark.dataSource.register(TopicDataSource)
    return spark


@contextmanager
def progress(spark: SparkSession, label: str, every: float = 5.0) -> Iterator[None]:
    """Print the running stages' task counts every `every` seconds while the block runs."""
    tracker = spark.sparkContext.statusTracker()
    done = threading.Event()
    began = time.monotonic()

    def report() -> None:
        while not done.wait(every):
            stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            parts = [
                f"stage {s.stageId}: {s.numCompletedTasks}/{s.numTasks} tasks"
                for s in stages
                if s is not None
            ]
            elapsed = time.monotonic() - began
            print(f"{label}: {elapsed:.0f} s, {'; '.join(parts) or 'planning'}", flush=True)

    thread = threading.Thread(target=report, name=f"progress-{label}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=1.0)
