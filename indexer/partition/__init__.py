"""Row planner: pure CPU code that splits query rows across tensor-parallel ranks."""

from .cost import DEFAULT_COST_MODEL, CostModel
from .plan import DEFAULT_STRIPE_ROWS, STRATEGIES, Range, RowPlan, fold_split, plan_candidates, plan_rows

__all__ = ["CostModel", "DEFAULT_STRIPE_ROWS", "DEFAULT_COST_MODEL", "Range", "RowPlan", "STRATEGIES", "fold_split", "plan_candidates", "plan_rows"]
