"""The batch side of Tandem on Spark: the twin of every declared join, reconcile, and the jobs
around them (docs/pipeline.md). `python -m pipeline --help` lists the commands.

    from pipeline import Parquet, Topics, join_frame
    results = join_frame(spark, "examples.orders", "paid", Topics("127.0.0.1:9092"))

`join_frame` (pipeline/twin.py) returns the join's results as a DataFrame, what the stream's
handler would be handed; `pipeline.spark.session()` makes a SparkSession set up for it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Parquet", "Topics", "join_frame", "run_twin"]


def __getattr__(name: str) -> Any:  # PySpark is imported by the jobs that need it, not by `import pipeline`
    if name in ("join_frame", "run_twin"):
        from pipeline import twin

        return getattr(twin, name)
    if name in ("Parquet", "Topics"):
        from pipeline import inputs

        return getattr(inputs, name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
