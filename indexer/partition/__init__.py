"""Row planner: pure CPU code that splits query rows across tensor-parallel ranks."""

from .cost import DEFAULT_COST_MODEL, CostModel
from .gate import MARGIN, GateDecision, TimeModel, model_gate
from .plan import DEFAULT_STRIPE_ROWS, STRATEGIES, Range, RowPlan, fold_split, plan_candidates, plan_rows
from .waves import chunk_cuts, even_cuts, split_rows, wave_plans

__all__ = ["CostModel", "DEFAULT_STRIPE_ROWS", "DEFAULT_COST_MODEL", "GateDecision", "MARGIN", "Range", "RowPlan",
           "STRATEGIES", "TimeModel", "chunk_cuts", "even_cuts", "fold_split", "model_gate", "plan_candidates", "plan_rows",
           "split_rows", "wave_plans"]
