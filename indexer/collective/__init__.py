"""Reassembly of per-rank top-k slices, chosen by probing the process group."""

from .agree import agreed_cost_model, forget_agreements
from .guard import InconsistentRanksError, check_consistency, fingerprint
from .probe import GroupCaps, backend_name, clear_cache, probe_group
from .reassemble import MODES, Exchange, RING_STRATEGIES, ReassemblyError, choose_mode, mode_reasons, reassemble, supported_modes

__all__ = [
    "Exchange",
    "GroupCaps",
    "InconsistentRanksError",
    "MODES",
    "RING_STRATEGIES",
    "ReassemblyError",
    "agreed_cost_model",
    "backend_name",
    "forget_agreements",
    "check_consistency",
    "choose_mode",
    "clear_cache",
    "fingerprint",
    "mode_reasons",
    "probe_group",
    "reassemble",
    "supported_modes",
]
