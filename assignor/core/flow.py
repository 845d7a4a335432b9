"""A min-cost flow with lower bounds, on OR-Tools' exact integer solver."""

from __future__ import annotations

from ortools.graph.python import min_cost_flow


class FlowNetwork:
    """Arcs with `[lower, upper]` bounds and integer costs; nodes carry supplies."""

    def __init__(self) -> None:
        self._tails: list[int] = []
        self._heads: list[int] = []
        self._caps: list[int] = []
        self._costs: list[int] = []
        self._lower: list[int] = []
        self._supply: list[int] = []

    def node(self, supply: int = 0) -> int:
        self._supply.append(supply)
        return len(self._supply) - 1

    def add_supply(self, node: int, amount: int) -> None:
        self._supply[node] += amount

    def arc(self, tail: int, head: int, upper: int, cost: int = 0, lower: int = 0) -> int:
        # A lower bound l is pre-routed: tail ships l, head receives l, l fewer remain.
        self._tails.append(tail)
        self._heads.append(head)
        self._caps.append(upper - lower)
        self._costs.append(cost)
        self._lower.append(lower)
        self._supply[tail] -= lower
        self._supply[head] += lower
        return len(self._tails) - 1

    @property
    def arc_count(self) -> int:
        return len(self._tails)

    def solve(self) -> list[int] | None:
        """Flow on every arc (lower bound included) at minimum cost, or None if infeasible."""
        if any(c < 0 for c in self._caps):
            return None
        solver = min_cost_flow.SimpleMinCostFlow()
        if self._tails:
            solver.add_arcs_with_capacity_and_unit_cost(
                self._tails, self._heads, self._caps, self._costs
            )
        for node, supply in enumerate(self._supply):
            if supply:
                solver.set_node_supply(node, supply)
        if not self._tails:
            return [] if not any(self._supply) else None
        if solver.solve() != solver.OPTIMAL:
            return None
        return [solver.flow(i) + low for i, low in enumerate(self._lower)]
