"""A min-cost flow with lower bounds, on OR-Tools' exact integer solver.

Arcs are added in bulk (numpy arrays): the planner builds networks with up to
millions of arcs, and a Python call per arc would dominate its run time.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from ortools.graph.python import min_cost_flow

IntArray = np.ndarray


class FlowNetwork:
    """Arcs with `[lower, upper]` bounds and integer costs; nodes carry supplies."""

    def __init__(self) -> None:
        self._blocks: list[tuple[IntArray, IntArray, IntArray, IntArray, IntArray]] = []
        self._supply_parts: list[tuple[IntArray, IntArray]] = []
        self._nodes = 0
        self._arcs = 0

    def nodes(self, count: int) -> IntArray:
        """`count` new node ids."""
        ids = np.arange(self._nodes, self._nodes + count, dtype=np.int64)
        self._nodes += count
        return ids

    @property
    def node_count(self) -> int:
        return self._nodes

    def supply(self, nodes: ArrayLike, amounts: ArrayLike) -> None:
        self._supply_parts.append((np.asarray(nodes, np.int64), np.asarray(amounts, np.int64)))

    def arcs(
        self,
        tails: ArrayLike,
        heads: ArrayLike,
        upper: ArrayLike,
        cost: ArrayLike = 0,
        lower: ArrayLike = 0,
    ) -> IntArray:
        """Add arcs; returns their ids (arrays, or one number for every arc). A lower bound is
        pre-routed from tail to head."""
        tail_ids = np.asarray(tails, np.int64)
        n = len(tail_ids)
        self._blocks.append(
            (
                tail_ids,
                np.asarray(heads, np.int64),
                np.broadcast_to(np.asarray(upper, np.int64), (n,)),
                np.broadcast_to(np.asarray(cost, np.int64), (n,)),
                np.broadcast_to(np.asarray(lower, np.int64), (n,)),
            )
        )
        ids = np.arange(self._arcs, self._arcs + n, dtype=np.int64)
        self._arcs += n
        return ids

    def solve(self) -> IntArray | None:
        """Flow on every arc (lower bound included) at minimum cost, or None if infeasible."""
        if not self._blocks:
            return np.zeros(0, np.int64) if self._balanced_without_arcs() else None
        columns = zip(*self._blocks, strict=True)
        tails, heads, upper, cost, lower = (np.concatenate(parts) for parts in columns)
        if (upper < lower).any():
            return None
        supply = np.zeros(self._nodes, np.int64)
        for nodes, amounts in self._supply_parts:
            np.add.at(supply, nodes, amounts)
        np.add.at(supply, tails, -lower)
        np.add.at(supply, heads, lower)
        solver = min_cost_flow.SimpleMinCostFlow()
        solver.add_arcs_with_capacity_and_unit_cost(tails, heads, upper - lower, cost)
        busy = np.nonzero(supply)[0]
        if len(busy):
            solver.set_nodes_supplies(busy, supply[busy])
        if solver.solve() != solver.OPTIMAL:
            return None
        return solver.flows(np.arange(len(tails))) + lower

    def _balanced_without_arcs(self) -> bool:
        return all(not np.asarray(a).any() for _, a in self._supply_parts)


def tie_weights(first: IntArray, second: IntArray, bits: int) -> IntArray:
    """A fixed pseudo-random weight in [0, 2**bits) per pair (a hash): breaks ties between
    equally good choices the same way every time, whatever the network around them."""
    with np.errstate(over="ignore"):  # unsigned arithmetic wraps, as a hash wants
        x = np.asarray(first).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        x += np.asarray(second).astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
        x ^= x >> np.uint64(29)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(32)
    return (x >> np.uint64(64 - bits)).astype(np.int64) if bits else np.zeros(x.shape, np.int64)
