"""The native (CUDA C++) row top-k: its algorithm on the CPU through the torch model that
mirrors it step for step, and on a GPU the kernel against that model, bit for bit."""

from __future__ import annotations

import pytest
import torch

from indexer.synthetic import LOGIT_DISTRIBUTIONS, logits_like
from indexer.topk.cuda import MAX_KEYS, SHAPES, NativeRowTopk, native_reasons, shape_for
from indexer.topk.cuda.model import checks_one_value, native_table, order_keys, radix_select
from indexer.topk.reference import row_topk


def _windows(rows: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, n + 1, (rows,), generator=g)
    lengths[:4] = n
    lengths[4:8] = torch.tensor([0, 1, k, k + 1]).clamp(max=n)
    starts = (torch.rand(rows, generator=g) * (n - lengths + 1).float()).floor().to(torch.int64)
    return starts, lengths


def _masked(logits: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    # the CPU reference reads whole rows: -inf outside the windows
    cols = torch.arange(logits.shape[1])
    inside = (cols >= starts[:, None]) & (cols < (starts + lengths)[:, None])
    return torch.where(inside, logits, float("-inf"))


def _sorted(t: torch.Tensor) -> torch.Tensor:
    return torch.sort(t.to(torch.int64), dim=1).values


@pytest.mark.parametrize("dist", LOGIT_DISTRIBUTIONS)
@pytest.mark.parametrize("n", [97, 700])
def test_model_selects_the_reference_set(dist, n):
    k = 48
    logits = logits_like(dist, 20, n, seed=n)
    starts, lengths = _windows(20, n, k, seed=n)
    masked = _masked(logits, starts, lengths)
    got = native_table(masked, starts, lengths, k, threads=32)
    want = torch.empty(20, k, dtype=torch.int32)
    row_topk(masked, starts, lengths, k, want)
    assert torch.equal(_sorted(got), _sorted(want))
    # the padding of short rows: every column, then -1
    for r in range(20):
        if int(lengths[r]) <= k:
            assert got[r].tolist() == list(range(int(lengths[r]))) + [-1] * (k - int(lengths[r]))


def test_model_orders_each_thread_s_columns_together():
    # thread t holds columns t, t + threads, ...: the table lists them thread by thread
    logits = torch.arange(64, dtype=torch.float32)[None]
    got = native_table(logits, torch.zeros(1, dtype=torch.int64), torch.full((1,), 64), 8, threads=4)
    assert got[0].tolist() == [56, 60, 57, 61, 58, 62, 59, 63]


def test_order_keys_rank_floats_as_torch_topk_does():
    v = torch.tensor([float("-inf"), -3.5, -0.0, 0.0, 1e-40, 2.0, float("inf"), float("nan"), -float("nan")])
    keys = order_keys(v)
    assert int(keys.min()) > 0, "0 marks an empty slot in the kernel"
    assert keys[2] == keys[3], "-0.0 and +0.0 tie"
    assert keys[7] == keys[8] == 0xFFFFFFFF, "every NaN above every number"
    assert bool((keys[:3].diff() > 0).all()) and bool((keys[3:8].diff() > 0).all())


@pytest.mark.parametrize("case", ["first pass whole", "ties beyond need", "nan and -0.0"])
def test_radix_select_passes(case):
    if case == "first pass whole":
        # values in distinct top-11-bit bins: the first pass's bin is needed whole
        v = torch.tensor([1.0, 4.0, 16.0, 64.0, 256.0, 0.25])
        mask = radix_select(order_keys(v), 3)
        assert mask.tolist() == [False, False, True, True, True, False]
    elif case == "ties beyond need":
        v = torch.tensor([1.0, 5.0, 5.0, 2.0, 5.0, 5.0, 7.0])
        mask = radix_select(order_keys(v), 3)  # 7, then the two lowest columns of the 5s
        assert mask.nonzero().flatten().tolist() == [1, 2, 6]
    else:
        v = torch.tensor([0.0, -0.0, float("nan"), -1.0, 0.0])
        mask = radix_select(order_keys(v), 3)  # NaN, then the zeros at columns 0 and 1
        assert mask.nonzero().flatten().tolist() == [0, 1, 2]


def _one_value_rows(n: int, k: int) -> list[torch.Tensor]:
    """Rows whose chosen bins hold one value, or look as if they might: each path of the
    kernel's one-value check (taken after the first pass, taken after the second, checked and
    failed, then checked again)."""
    g = torch.Generator().manual_seed(n)
    ulp = 2.0 ** -23
    rows = [
        torch.ones(n),                                            # first pass: one value
        torch.randint(0, 8, (n,), generator=g).float(),           # first pass: the k-th's value
        (torch.randn(n, generator=g) - 2.5).clamp_min(0.0),       # zeros below a few positives
        1.0 + ulp * torch.randint(0, 4, (n,), generator=g).float(),  # one top-22-bit bin, 4 values
        torch.where(torch.rand(n, generator=g) < 0.5, 1.0, 1.0 + 2.0 ** -5),  # two second-pass bins
    ]
    short = torch.full((n,), -1.0)
    short[: k + k // 2] = 3.0  # a bin of 1.5 k keys: checked only after the second pass
    rows.append(short)
    return rows


def test_the_one_value_check_keeps_the_lowest_index_set():
    k = 64
    for n in (100, 1000):
        for i, row in enumerate(_one_value_rows(n, k)):
            mask = radix_select(order_keys(row), k)
            want = torch.zeros(n, dtype=torch.bool)
            # the reference: descending value, then ascending column
            order = sorted(range(n), key=lambda c: (-float(row[c]), c))
            want[order[:k]] = True
            assert torch.equal(mask, want), (n, i)
    # where the kernel looks: a bin fuller than 1/16 of the row and than twice what is needed
    assert checks_one_value(0, 1001, 16000, 500, 16000)
    assert not checks_one_value(0, 999, 16000, 500, 16000)
    assert not checks_one_value(0, 2048, 16384, 2047, 16384)  # a ramp's first bin
    assert checks_one_value(1, 3000, 3000, 2048, 3000) and not checks_one_value(1, 2999, 3000, 2048, 3000)


def test_shape_for_takes_the_first_block_that_holds_the_window():
    assert shape_for(1) == SHAPES[0]
    for n in (4096, 4097, 8192, 16384, 16385, MAX_KEYS):
        threads, slots = shape_for(n)
        assert threads * slots >= n
        assert all(t * s < n for t, s in SHAPES[:SHAPES.index((threads, slots))])
    assert shape_for(16384) == (512, 32)
    assert shape_for(MAX_KEYS) == (1024, 32)
    with pytest.raises(ValueError, match=str(MAX_KEYS)):
        shape_for(MAX_KEYS + 1)


def test_native_reasons_off_a_gpu():
    assert native_reasons(torch.device("cpu")) == ["needs an NVIDIA GPU, not cpu"]
    with pytest.raises(RuntimeError, match="NVIDIA GPU"):
        NativeRowTopk(torch.device("cpu"), 1, 8, torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
                      4)


@pytest.fixture
def dev() -> torch.device:
    """The current CUDA device where the kernel can run there (builds it the first time);
    otherwise the test skips with the reasons."""
    if not torch.cuda.is_available() or torch.version.cuda is None:
        pytest.skip("needs an NVIDIA GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    why = native_reasons(device)
    if why:
        pytest.skip("; ".join(why))
    return device


@pytest.mark.cuda
@pytest.mark.parametrize("n", [1500, 4096, 8192, 16384, 20000, 32768])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_kernel_writes_the_model_s_table(n, index_dtype, dev):
    k = 2048
    for dist in LOGIT_DISTRIBUTIONS:
        logits = logits_like(dist, 24, n, dev, seed=n)
        starts, lengths = _windows(24, n, k, seed=n)
        run = NativeRowTopk(dev, 24, n, starts.to(dev, index_dtype), lengths.to(dev, index_dtype), k)
        wide = torch.full((24, k + 8), -9, dtype=torch.int32, device=dev)
        run(logits, wide[:, :k])  # a row-strided view
        want = native_table(logits.cpu(), starts, lengths, k, threads=run.threads)
        assert torch.equal(wide[:, :k].cpu(), want), dist
        assert bool((wide[:, k:] == -9).all()), "columns past topk untouched"


@pytest.mark.cuda
@pytest.mark.parametrize("k", [64, 9000])
def test_kernel_writes_the_model_s_table_at_other_k(k, dev):
    # 9000 is past the shared-memory staging of the table (written directly instead)
    n = 20000
    for dist in ("gaussian", "equal", "relu_zeros"):
        logits = logits_like(dist, 16, n, dev, seed=k)
        starts, lengths = _windows(16, n, k, seed=k)
        run = NativeRowTopk(dev, 16, n, starts.to(dev), lengths.to(dev), k)
        out = torch.full((16, k), -9, dtype=torch.int32, device=dev)
        run(logits, out)
        assert torch.equal(out.cpu(), native_table(logits.cpu(), starts, lengths, k, threads=run.threads)), dist


@pytest.mark.cuda
@pytest.mark.parametrize("n", [3000, 8192, 16384, 32768])
def test_kernel_writes_the_model_s_table_where_a_bin_is_one_value(n, dev):
    k = 2048
    rows = _one_value_rows(n, k)
    logits = torch.stack(rows + [r.flip(0) for r in rows]).to(dev)
    r = logits.shape[0]
    starts = torch.zeros(r, dtype=torch.int32)
    lengths = torch.full((r,), n, dtype=torch.int32)
    lengths[1::2] = max(k + 1, n - 777)  # windows shorter than the row, odd lengths
    run = NativeRowTopk(dev, r, n, starts.to(dev), lengths.to(dev), k)
    out = torch.full((r, k), -9, dtype=torch.int32, device=dev)
    run(logits, out)
    assert torch.equal(out.cpu(), native_table(logits.cpu(), starts, lengths, k, threads=run.threads))


@pytest.mark.cuda
@pytest.mark.parametrize("n", [8192, 16384, 32768])
def test_kernel_writes_the_model_s_table_over_many_rows_of_unaligned_windows(n, dev):
    # more rows than the GPU holds blocks at once (several waves of blocks); windows at every
    # alignment (a row-strided view one column in, odd strides and starts), short rows
    # between long ones
    k = 2048
    rows = 5 * torch.cuda.get_device_properties(dev).multi_processor_count + 3
    for dist in ("gaussian", "few_distinct", "ascending"):
        block = logits_like(dist, rows, n + 3, dev, seed=rows)
        logits = block[:, 1:n + 1]
        starts, lengths = _windows(rows, n, k, seed=n)
        lengths[8::5] = torch.randint(0, k + 1, lengths[8::5].shape)
        starts = torch.minimum(starts, n - lengths)
        run = NativeRowTopk(dev, rows, n, starts.to(dev), lengths.to(dev), k)
        out = torch.full((rows, k), -9, dtype=torch.int32, device=dev)
        run(logits, out)
        want = native_table(logits.cpu(), starts, lengths, k, threads=run.threads)
        assert torch.equal(out.cpu(), want), dist


@pytest.mark.cuda
def test_kernel_replays_in_a_cuda_graph_and_reads_refreshed_bounds(dev):
    n, k, rows = 16384, 2048, 64
    logits = logits_like("gaussian", rows, n, dev)
    starts = torch.zeros(rows, dtype=torch.int32, device=dev)
    lengths = torch.full((rows,), n, dtype=torch.int32, device=dev)
    out = torch.empty(rows, k, dtype=torch.int32, device=dev)
    run = NativeRowTopk(dev, rows, n, starts, lengths, k)
    run(logits, out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(logits, out)
    new_s, new_l = _windows(rows, n, k, seed=3)
    starts.copy_(new_s)
    lengths.copy_(new_l)
    logits.normal_()
    graph.replay()
    want = native_table(logits.cpu(), new_s, new_l, k, threads=run.threads)
    assert torch.equal(out.cpu(), want)


@pytest.mark.cuda
def test_a_plan_with_short_rows_takes_the_native_top_k_and_its_sets(monkeypatch, dev):
    import indexer
    from indexer.synthetic import make_inputs

    inp = make_inputs([9000, 3000], [64, 64], heads=8, head_dim=32, device=dev, seed=5)
    q, k, k_scale, weights, starts, ends = inp.args()

    def plan():
        return indexer.plan(starts, ends, num_keys=k.shape[0], heads=8, head_dim=32, topk=2048, backend="triton")

    monkeypatch.delenv("INDEXER_NATIVE_TOPK_MAX_KEYS", raising=False)
    monkeypatch.delenv("INDEXER_CUDA_NATIVE_TOPK_MAX_KEYS", raising=False)
    native = plan()
    assert "top-k native" in str(native)
    got = native.run(q, k, k_scale, weights)
    # the same logits through the Triton top-k: the same sets
    monkeypatch.setenv("INDEXER_NATIVE_TOPK_MAX_KEYS", "0")
    triton = plan()
    assert "native" not in str(triton)
    want = triton.run(q, k, k_scale, weights)
    assert torch.equal(_sorted(got.cpu()), _sorted(want.cpu()))


def test_native_fits_the_rows_an_sm_may_queue():
    from indexer.topk.cuda import ROWS_PER_SM, native_fits

    assert set(ROWS_PER_SM) == set(SHAPES)
    for n in (4096, 8192, 16384, 32768):
        per_sm = ROWS_PER_SM[shape_for(n)]
        assert native_fits(132 * per_sm, n, 132)
        assert not native_fits(132 * per_sm + 1, n, 132)
    assert native_fits(1056, 16384, 132) and not native_fits(2048, 16384, 132)
    assert native_fits(4096, 8192, 132) and not native_fits(512, 32768, 132)
    assert not native_fits(1, MAX_KEYS + 1, 132)


def test_native_max_keys_is_off_on_cpu_and_an_explicit_value_that_cannot_run_raises(monkeypatch):
    from indexer.topk.choice import native_max_keys

    cpu = torch.device("cpu")
    monkeypatch.delenv("INDEXER_NATIVE_TOPK_MAX_KEYS", raising=False)
    monkeypatch.delenv("INDEXER_CPU_NATIVE_TOPK_MAX_KEYS", raising=False)
    assert native_max_keys(cpu) == (0, "")
    monkeypatch.setenv("INDEXER_NATIVE_TOPK_MAX_KEYS", "16384")
    with pytest.raises(ValueError, match="INDEXER_NATIVE_TOPK_MAX_KEYS.*NVIDIA GPU"):
        native_max_keys(cpu)
    monkeypatch.setenv("INDEXER_NATIVE_TOPK_MAX_KEYS", str(MAX_KEYS + 1))
    with pytest.raises(ValueError, match=f"at most {MAX_KEYS}"):
        native_max_keys(cpu)
    monkeypatch.setenv("INDEXER_NATIVE_TOPK_MAX_KEYS", "-1")
    with pytest.raises(ValueError, match="INDEXER_NATIVE_TOPK_MAX_KEYS"):
        native_max_keys(cpu)
