"""Reassembly of per-rank top-k slices, chosen by probing the process group."""

from .agree import agreed_cost_model, agreed_time_model, forget_agreements
from .guard import InconsistentRanksError, check_consistency, fingerprint
from .probe import GroupCaps, backend_name, clear_cache, probe_group
from .reassemble import (
    GATHER_MODES,
    MODES,
    NARROW_AUTO_WINDOW,
    NARROW_MAX_WINDOW,
    RING_STRATEGIES,
    WAVE_MODES,
    Exchange,
    NarrowExchange,
    WaveExchange,
    ReassemblyError,
    choose_mode,
    exchange_bits,
    make_exchange,
    mode_reasons,
    reassemble,
    supported_modes,
)

__all__ = [
    "Exchange",
    "GATHER_MODES",
    "NARROW_AUTO_WINDOW",
    "NARROW_MAX_WINDOW",
    "NarrowExchange",
    "GroupCaps",
    "InconsistentRanksError",
    "MODES",
    "RING_STRATEGIES",
    "ReassemblyError",
    "WAVE_MODES",
    "WaveExchange",
    "agreed_cost_model",
    "agreed_time_model",
    "backend_name",
    "forget_agreements",
    "check_consistency",
    "choose_mode",
    "exchange_bits",
    "clear_cache",
    "fingerprint",
    "make_exchange",
    "mode_reasons",
    "probe_group",
    "reassemble",
    "supported_modes",
]
