"""Tandem's assignor: a pure planning core, its command line, the wire format and the Faust adapter.

`plan(scenario) -> assignment` is the whole contract (docs/scenario-format.md).
"""

from assignor.core.plan import PlanResult, PlanStats, plan, plan_with_stats

__all__ = ["PlanResult", "PlanStats", "plan", "plan_with_stats"]
