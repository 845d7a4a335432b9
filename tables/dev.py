"""Run your own app locally: the embedded broker and N workers of it, on this machine.

    python -m tables.dev APP [--workers 2] [--standbys 1] [--partitions N] [--run-dir DIR]

APP is what `faust -A` takes (a module, or module:attribute). The joins' topics are created
first; each worker gets its own data dir, web port and host label (tables/testing/cluster.py);
the pages and metrics are printed once the group is stable; Ctrl-C stops everything (by pid)
and keeps the run directory (worker logs, data dirs, the broker's log). Produce to the printed
bootstrap address with any Kafka client.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tables.testing.cluster import LocalCluster


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tables.dev", description=__doc__.split("\n\n")[0])
    parser.add_argument("app", help="the app, as `faust -A` takes it (module or module:attribute)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--standbys", type=int, default=1, help="standby replicas (default 1)")
    parser.add_argument("--partitions", type=int, help="the joins' partition count (default: declared)")
    parser.add_argument("--run-dir", type=Path, help="logs and data dirs (default: a new temporary dir)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for a stable group")
    args = parser.parse_args(argv)
    stop = {"now": False}

    def interrupted(signum: int, frame: object) -> None:
        stop["now"] = True

    cluster = LocalCluster(
        args.app, args.workers, args.standbys, args.partitions, args.run_dir, cwd=Path.cwd()
    )
    try:
        cluster.start()
        print(f"broker: {cluster.bootstrap}  (run dir {cluster.run_dir})", flush=True)
        for spec in cluster.specs:
            rekeyed = "".join(f" ({r.source.name} rekeyed into {r.name})" for r in spec.repartitions)
            inputs = " + ".join(spec.input_topics)
            print(f"join {spec.name}: {inputs}{rekeyed} -> handler {spec.handler.__name__}")
        cluster.wait_ready(args.timeout)
        print("ready: every partition owned and restored", flush=True)
        print("\n".join(cluster.pages()), flush=True)
        print("Ctrl-C stops the workers and the broker", flush=True)
        signal.signal(signal.SIGINT, interrupted)
        signal.signal(signal.SIGTERM, interrupted)
        while not stop["now"]:
            time.sleep(0.2)
            for worker in cluster.workers:
                worker.check()
    except (RuntimeError, TimeoutError, ValueError, ImportError) as error:
        print(f"tables.dev: {error}", file=sys.stderr, flush=True)
        return 1
    finally:
        print("stopping...", flush=True)
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
