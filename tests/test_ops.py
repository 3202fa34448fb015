"""indexer.ops: the custom ops give prefill_topk's and a plan's sets, eager and under torch.compile."""

from __future__ import annotations

import pytest
import torch

import indexer
from indexer import ops
from indexer.synthetic import make_inputs

from conftest import sets_equal

TOPK = 8


def _inputs(seed=1):
    # a packed batch: a late chunk of a long request and a whole short one
    return make_inputs([300, 50], [120, 50], heads=4, head_dim=32, seed=seed)


def test_the_prefill_op_gives_prefill_topks_sets():
    inp = _inputs()
    want = indexer.prefill_topk(*inp.args(), TOPK, backend="torch")
    out = torch.full_like(want, 7)
    torch.ops.indexer.prefill_topk(*inp.args(), TOPK, out)
    assert sets_equal(out, want)


def test_the_plan_op_runs_the_registered_plan_for_each_layer():
    inp = _inputs()
    plan = indexer.plan(inp.row_starts, inp.row_ends, num_keys=inp.k.shape[0], heads=4, head_dim=32, topk=TOPK)
    handle = ops.register_plan(plan)
    try:
        for seed in (2, 3):  # other layers: other values, the same bounds
            layer = make_inputs([300, 50], [120, 50], heads=4, head_dim=32, seed=seed)
            out = torch.full((inp.q.shape[0], TOPK), 7, dtype=torch.int32)
            torch.ops.indexer.plan_run(handle, layer.q, layer.k, layer.k_scale, layer.weights, out)
            assert sets_equal(out, indexer.prefill_topk(*layer.args(), TOPK))
    finally:
        ops.unregister_plan(handle)
    with pytest.raises(ValueError, match="handle"):
        torch.ops.indexer.plan_run(handle, inp.q, inp.k, inp.k_scale, inp.weights, out)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_both_ops_trace_under_torch_compile(backend):
    inp = _inputs()
    plan = indexer.plan(inp.row_starts, inp.row_ends, num_keys=inp.k.shape[0], heads=4, head_dim=32, topk=TOPK)
    handle = ops.register_plan(plan)

    def layer(q, k, k_scale, weights, row_starts, row_ends, a, b):
        # the ops between other work, as in a compiled model
        torch.ops.indexer.prefill_topk(q, k, k_scale, weights * 1.0, row_starts, row_ends, TOPK, a)
        torch.ops.indexer.plan_run(handle, q, k, k_scale, weights, b)
        return a + 0, b + 0

    try:
        compiled = torch.compile(layer, fullgraph=True, backend=backend)
        m = inp.q.shape[0]
        a = torch.full((m, TOPK), 7, dtype=torch.int32)
        b = torch.full((m, TOPK), 7, dtype=torch.int32)
        ra, rb = compiled(*inp.args(), a, b)
    finally:
        ops.unregister_plan(handle)
    want = indexer.prefill_topk(*inp.args(), TOPK)
    assert sets_equal(ra, want) and sets_equal(rb, want)
    assert sets_equal(a, want) and sets_equal(b, want)  # written in place, as the schema says


def test_the_prefill_op_passes_opchecks_fake_tensor_and_aot_checks():
    inp = _inputs()
    out = torch.full((inp.q.shape[0], TOPK), 7, dtype=torch.int32)
    # the fake implementation against the real one, and the op under AOT dispatch (opcheck's
    # schema check multiplies the inputs, which float8 tensors do not support on the CPU)
    torch.library.opcheck(torch.ops.indexer.prefill_topk.default, (*inp.args(), TOPK, out),
                          test_utils=("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic"))


def test_register_plan_takes_plans_only():
    with pytest.raises(TypeError, match="plan"):
        ops.register_plan(object())
