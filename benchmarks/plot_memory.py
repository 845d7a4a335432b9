"""Peak RSS of a windowed-join worker against the records live in its window, each window
index, from the table of docs/bench/memory.md (rows of `bench_memory`); writes the plot
next to it.

    PYTHONPATH=. .venv/bin/python -m benchmarks.plot_memory
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "bench" / "memory.md"
GOALS = {10_000_000: 600, 30_000_000: 700}  # issue 37: MB of RSS at most
# A row's first cell starts with the index it ran: its line's label.
LABELS = {
    "budget": "default: in memory within the budget, then in RocksDB",
    "memory": "index in memory",
    "rocksdb": "index in RocksDB",
}


def rows(text: str) -> dict[str, list[tuple[int, float]]]:
    """index -> [(live records, peak RSS MB)] from the table's rows (`| memory ... | 1,000,000 | 748 |`)."""
    found: dict[str, list[tuple[int, float]]] = {}
    for line in text.splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]  # **bold** too
        if (
            len(cells) < 3
            or not cells[1].replace(",", "").isdigit()
            or not cells[2].replace(",", "").isdigit()
        ):
            continue
        index = next((name for name in LABELS if cells[0].startswith(name)), "rocksdb")
        found.setdefault(index, []).append((int(cells[1].replace(",", "")), float(cells[2].replace(",", ""))))
    return found


def main() -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for index, points in sorted(rows(DOC.read_text()).items()):
        points.sort()
        ax.plot([n / 1e6 for n, _ in points], [mb for _, mb in points], marker="o", label=LABELS[index])
    for live, mb in GOALS.items():
        ax.plot([live / 1e6], [mb], marker="_", markersize=20, color="red")
    ax.set_xlabel("records live in the window (millions)")
    ax.set_ylabel("peak RSS (MB)")
    ax.set_yscale("log")
    ax.set_title("One windowed-join worker (bench_memory); red: the goal")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(DOC.with_suffix(".png"), dpi=90)


if __name__ == "__main__":
    main()
