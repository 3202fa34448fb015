"""Direct launches of compiled Triton kernels (``indexer.topk.triton.launch``): the key
against Triton's own specialization, the launcher's paths, and on an NVIDIA GPU the top-k
through them."""

from __future__ import annotations

import dataclasses

import itertools

import pytest
import torch

triton = pytest.importorskip("triton")

from indexer.topk import row_topk  # noqa: E402
from indexer.topk.triton import launch as L  # noqa: E402
from indexer.topk.triton import ragged as T  # noqa: E402

# the sampled path at toy sizes (the sm90 config otherwise, these run on NVIDIA GPUs)
SMALL = dict(piece=8, sparse=4)


def _cfg(**kw):
    # the row kernel off unless asked: these rows are few and short enough for it
    return dataclasses.replace(T.launch_config(torch.device("cuda")), **dict(dict(row_max=0), **kw))


def _triton_spec(arg):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    return native_specialize_impl(CUDABackend, arg, False, True, True)


def _args():
    ints = [0, 1, 2, 15, 16, 17, 32, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**32 + 1, -2**31,
            -2**31 - 1, -2**31 - 16, 2**63 - 16, 2**63, 2**63 + 16, 2**64 - 1]
    base = torch.zeros(64, dtype=torch.float32)
    tensors = [base[i:] for i in range(6)] + [base.view(torch.int32)[i:] for i in range(4)]
    tensors += [torch.zeros(64, dtype=torch.int64)[i:] for i in range(3)]
    return ints + tensors


def test_the_key_separates_what_triton_specializes_on():
    pytest.importorskip("triton.backends.nvidia.compiler")
    args = _args()
    for a, b in itertools.combinations_with_replacement(args, 2):
        same_key = L.spec_key((a,)) == L.spec_key((b,))
        same_spec = _triton_spec(a) == _triton_spec(b)
        # one key, one compiled kernel: equal keys must mean equal specializations (and the
        # key is no finer than needed, so a launch finds its kernel)
        assert same_key == same_spec, (a if isinstance(a, int) else (a.dtype, a.data_ptr() % 16),
                                       b if isinstance(b, int) else (b.dtype, b.data_ptr() % 16))


def test_the_key_refuses_other_argument_types():
    assert L.spec_key((1, 2.0)) is None
    assert L.spec_key((True,)) is None  # a bool is an int to isinstance, not to Triton
    assert L.spec_key((None,)) is None
    assert L.spec_key((3, torch.zeros(2))) is not None


class _Compiled:
    def __init__(self, fail=False):
        self.function, self.packed_metadata, self.calls, self.fail = object(), object(), [], fail

    def run(self, *a):
        if self.fail:
            raise TypeError("function takes exactly 9 arguments")
        self.calls.append(a)


class _Jit:
    """Stands for a JITFunction with parameters (x, n, A, B): records its launches."""

    arg_names = ["x", "n", "A", "B"]

    def __init__(self, fail=False):
        self.launches, self.compiled, self.fail = [], {}, fail

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.launches.append((grid, args, dict(kw)))
            spec = (L.spec_key(args), tuple(sorted(kw.items())))
            return self.compiled.setdefault(spec, _Compiled(self.fail))
        return launch


def test_the_launcher_launches_directly_once_the_jit_chose_the_kernel(monkeypatch):
    monkeypatch.setattr(L, "_current_stream", lambda index: 1234)
    fn = _Jit()
    launch = L.Launcher(fn)
    kw = L.LaunchKw(B=2, A=1, num_warps=4)  # not in parameter order: the constexprs follow it
    x = torch.zeros(64)
    launch(7, (x, 5), kw, 0)
    assert len(fn.launches) == 1 and launch.jit_launches == 1
    launch(9, (x, 5), kw, 0)  # same key: the compiled kernel's own launcher, constexprs appended
    (compiled,) = fn.compiled.values()
    assert len(fn.launches) == 1 and launch.direct_launches == 1
    grid0, grid1, grid2, stream, function, meta, md, enter, leave, *args = compiled.calls[0]
    assert (grid0, grid1, grid2, stream, function, meta) == (9, 1, 1, 1234, compiled.function, compiled.packed_metadata)
    assert (md, enter, leave) == (None, None, None)
    # a pointer goes as its address (the launcher takes an int as the pointer itself)
    assert args == [x.data_ptr(), 5, 1, 2]
    # anything Triton specializes on differently goes back to the JIT: a misaligned tensor,
    # an int of 1, another dtype, other constexprs, another device
    for args, k, dev in (((x[1:], 5), kw, 0), ((x, 1), kw, 0), ((x.double(), 5), kw, 0),
                         ((x, 5), L.LaunchKw(A=1, B=3, num_warps=4), 0), ((x, 5), kw, 1)):
        before = len(fn.launches)
        launch(3, args, k, dev)
        assert len(fn.launches) == before + 1
    # an int of the same class, an aligned view at another address: direct
    before = len(fn.launches)
    launch(3, (x[4:], 21), kw, 0)
    assert len(fn.launches) == before and launch.direct_launches == 2
    # not allowed to: always the JIT
    launch(3, (x, 5), kw, 0, direct=False)
    assert len(fn.launches) == before + 1
    # constexprs equal as numbers but not as types are other kernels to Triton (8 vs 8.0)
    launch(3, (x, 5), L.LaunchKw(B=2.0, A=1, num_warps=4), 0)
    assert len(fn.launches) == before + 2


def test_a_bound_launch_converts_only_its_slots_and_launches_as_a_full_call(monkeypatch):
    monkeypatch.setattr(L, "_current_stream", lambda index: 1)
    fn = _Jit()
    launch = L.Launcher(fn)
    kw = L.LaunchKw(A=1, B=2, num_warps=4)
    x, y = torch.zeros(64), torch.zeros(64)
    bound = launch.bind((0, 5), kw, 0, True, (0,))  # n fixed at 5, x given per call
    bound(7, x)  # first: the JIT, with the full arguments
    assert fn.launches[-1][1] == (x, 5) and launch.jit_launches == 1
    bound(8, y[4:])  # another aligned tensor: the same kernel, directly, its address
    (compiled,) = fn.compiled.values()
    assert launch.direct_launches == 1 and compiled.calls[-1][9:] == (y[4:].data_ptr(), 5, 1, 2)
    launch(9, (y, 5), kw, 0)  # a full call finds the kernel the bound launch made
    assert launch.direct_launches == 2 and len(fn.launches) == 1
    z = y[1:]
    bound(3, z)  # misaligned: another specialization, back to the JIT
    assert len(fn.launches) == 2 and fn.launches[-1][1] == (z, 5)
    # several slots, ints among them: an int of 1 is a constant to Triton, another kernel
    two = launch.bind((0, 0), kw, 0, True, (0, 1))
    two(4, x, 5)
    assert launch.direct_launches == 3
    two(4, x, 1)
    assert len(fn.launches) == 3


def test_a_place_in_a_buffer_launches_as_its_view_would():
    # At(t, i): the JIT gets the view t[i:]; a direct launch its address; both one key
    buf = torch.zeros(64, dtype=torch.int32)
    for i in range(9):
        at = L.At(buf, i)
        view = at.view()
        assert view.data_ptr() == at.address == buf.data_ptr() + 4 * i and view.dtype == buf.dtype
        assert at.view() is view  # made once
        assert L.spec_key((at, 3)) == L.spec_key((view, 3))
        assert L.At(buf, i, base=buf.data_ptr()).address == at.address
    assert L.jit_args((L.At(buf, 4), 7, buf))[1:] == (7, buf)


def test_the_launcher_passes_places_as_views_to_the_jit_and_addresses_directly(monkeypatch):
    monkeypatch.setattr(L, "_current_stream", lambda index: 1)
    fn = _Jit()
    launch = L.Launcher(fn)
    kw = L.LaunchKw(A=1, B=2)
    buf = torch.zeros(64, dtype=torch.int32)
    launch(1, (L.At(buf, 4), 5), kw, 0)
    (_, args, _), = fn.launches
    assert isinstance(args[0], torch.Tensor) and args[0].data_ptr() == buf.data_ptr() + 16
    launch(1, (L.At(buf, 8), 5), kw, 0)  # aligned too: the kernel the JIT chose for At(buf, 4)
    (compiled,) = fn.compiled.values()
    assert len(fn.launches) == 1 and compiled.calls[0][9:] == (buf.data_ptr() + 32, 5, 1, 2)
    launch(1, (L.At(buf, 5), 5), kw, 0)  # misaligned: another specialization, the JIT's
    assert len(fn.launches) == 2
    # equal constexprs made twice: one key (an int standing for the items), typed
    assert L.LaunchKw(A=1, B=2).key == kw.key != L.LaunchKw(A=1, B=2.0).key


def test_the_launcher_keys_on_the_knobs_and_globals_the_jit_watches(monkeypatch):
    knobs = pytest.importorskip("triton.knobs")
    monkeypatch.setattr(L, "_current_stream", lambda index: 1)
    fn = _Jit()
    fn.used_global_vals = {("G", 0): (3, {"G": 3})}
    launch = L.Launcher(fn)
    kw = L.LaunchKw(A=1, B=2)
    x = torch.zeros(8)
    launch(1, (x, 5), kw, 0)
    launch(1, (x, 5), kw, 0)
    assert (len(fn.launches), launch.direct_launches) == (1, 1)
    # debug mode (device asserts) is another kernel to the JIT
    monkeypatch.setattr(knobs.runtime, "debug", True)
    launch(1, (x, 5), kw, 0)
    assert (len(fn.launches), launch.direct_launches) == (2, 1)
    monkeypatch.setattr(knobs.runtime, "debug", False)
    launch(1, (x, 5), kw, 0)
    assert (len(fn.launches), launch.direct_launches) == (2, 2)
    # a global the kernel reads changed: the JIT (which refuses it) launches
    fn.used_global_vals[("G", 0)][1]["G"] = 4
    launch(1, (x, 5), kw, 0)
    assert (len(fn.launches), launch.direct_launches) == (3, 2)
    fn.used_global_vals[("G", 0)][1]["G"] = 3
    # a pre-run hook must see every launch
    fn.pre_run_hooks = [lambda *a, **k: None]
    launch(1, (x, 5), kw, 0)
    assert (len(fn.launches), launch.direct_launches) == (4, 2)


def test_the_launcher_leaves_hooks_and_refusing_launchers_to_the_jit(monkeypatch):
    knobs = pytest.importorskip("triton.knobs")
    monkeypatch.setattr(L, "_current_stream", lambda index: 1)
    fn = _Jit()
    launch = L.Launcher(fn)
    kw = L.LaunchKw(A=1, B=2)
    x = torch.zeros(8)
    launch(1, (x, 5), kw, 0)
    hook = lambda *a: None  # noqa: E731
    knobs.runtime.launch_exit_hook.add(hook)
    try:
        launch(1, (x, 5), kw, 0)
    finally:
        knobs.runtime.launch_exit_hook.remove(hook)
    assert len(fn.launches) == 2 and launch.direct_launches == 0  # a profiler's hook sees every launch
    launch(1, (x, 5), kw, 0)
    assert len(fn.launches) == 2 and launch.direct_launches == 1  # the chain is empty again
    # a launcher that refuses the arguments (another Triton's convention): nothing ran there,
    # the JIT launches, and the launcher stops trying
    fn = _Jit(fail=True)
    launch = L.Launcher(fn)
    launch(1, (x, 5), kw, 0)
    launch(1, (x, 5), kw, 0)
    assert len(fn.launches) == 2 and launch.direct_launches == 0
    launch(1, (x, 5), kw, 0)
    (compiled,) = fn.compiled.values()
    assert len(fn.launches) == 3 and compiled.calls == [] and launch.direct_launches == 0


@pytest.mark.cuda
@pytest.mark.parametrize("row_max", [0, 8192])
def test_topk_through_direct_launches_matches_the_jits_and_torchs(row_max):
    # the sample, filter and select launches, or the row kernel's one launch (row_max)
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(5)
    rows, n, topk = 64, 6000, 64
    block = torch.randn(rows, n + 8, generator=g)
    starts = torch.randint(0, 500, (rows,), generator=g)
    lengths = torch.randint(100, n - 500, (rows,), generator=g)
    lengths[:3] = torch.tensor([0, topk, 5])
    col = torch.arange(n)
    launchers = (T.ROW_LAUNCHER,) if row_max else (T.FILTER_LAUNCHER, T.SELECT_LAUNCHER)
    counts = [x.direct_launches for x in launchers]
    # aligned and misaligned logits (a view one float in), int32 and int64 bounds, sample_min
    # 0, 1 (a constant to Triton) and 16: each a specialization of its own, one after another
    for shift, dtype, sample_min in itertools.product((0, 1, 0), (torch.int64, torch.int32), (0, 1, 16)):
        logits = block.to(dev)[:, shift:shift + n]
        inside = (col[None] >= starts[:, None]) & (col[None] < (starts + lengths)[:, None])
        want = torch.empty(rows, topk, dtype=torch.int32)
        row_topk(torch.where(inside, block[:, shift:shift + n], float("-inf")), starts, lengths, topk, want)
        outs = []
        for direct in (True, False, True):
            out = torch.full((rows, topk), 7, dtype=torch.int32, device=dev)
            T.ragged_topk(logits, starts.to(dtype).to(dev), lengths.to(dtype).to(dev), topk, out, direct_launch=direct, 
                          config=_cfg(sample_min=sample_min, row_max=row_max, **SMALL))
            outs.append(out.cpu().sort(1).values)
        assert torch.equal(outs[0], want.sort(1).values)
        assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0])
    after = [x.direct_launches for x in launchers]
    # the filter and the first select (or the row kernel) launched directly at least once a
    # specialization seen before
    assert all(a > b for a, b in zip(after, counts)), (after, counts)


def test_direct_launch_must_be_a_bool_or_none():
    logits = torch.zeros(2, 8)
    out = torch.zeros(2, 4, dtype=torch.int32)
    idx = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="direct_launch"):
        T.ragged_topk(logits, idx, idx, 4, out, direct_launch=1)


@pytest.mark.cuda
@pytest.mark.parametrize("row_max", [0, 8192])
def test_topk_through_direct_launches_replays_from_a_cuda_graph(row_max):
    # an engine may capture the call: the direct launches must go to the capturing stream
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(9)
    rows, n, topk = 48, 5000, 64
    starts = torch.randint(0, 400, (rows,), generator=g)
    lengths = torch.randint(200, n - 400, (rows,), generator=g)
    col = torch.arange(n)
    inside = (col[None] >= starts[:, None]) & (col[None] < (starts + lengths)[:, None])
    logits = torch.randn(rows, n, generator=g).to(dev)
    st, ln = starts.to(dev), lengths.to(dev)
    out = torch.full((rows, topk), 7, dtype=torch.int32, device=dev)
    call = lambda: T.ragged_topk(logits, st, ln, topk, out, direct_launch=True, config=_cfg(row_max=row_max, **SMALL))  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
        call()  # the second call launches directly
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for seed in (1, 2):
        fresh = torch.randn(rows, n, generator=torch.Generator().manual_seed(seed))
        logits.copy_(fresh.to(dev))
        out.fill_(7)
        graph.replay()
        torch.cuda.synchronize()
        want = torch.empty(rows, topk, dtype=torch.int32)
        row_topk(torch.where(inside, fresh, float("-inf")), starts, lengths, topk, want)
        assert torch.equal(out.cpu().sort(1).values, want.sort(1).values)


def test_a_bad_direct_launch_flag_is_refused_before_any_kernel(monkeypatch):
    logits = torch.randn(3, 40)
    out = torch.full((3, 4), 5, dtype=torch.int32)
    idx = torch.tensor([0, 2, 1])
    lens = torch.tensor([40, 30, 20])
    monkeypatch.setenv("INDEXER_TRITON_DIRECT_LAUNCH", "sometimes")
    with pytest.raises(ValueError, match="INDEXER_TRITON_DIRECT_LAUNCH"):
        T.ragged_topk(logits, idx, lens, 4, out)
    assert (out == 5).all()


def test_the_device_guard_switches_only_to_another_device(monkeypatch):
    import contextlib

    from indexer.platform import device_guard

    class _OnCuda:
        is_cuda = True

        def __init__(self, index):
            self.index = index

        def get_device(self):
            return self.index

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert isinstance(device_guard(torch.zeros(1)), contextlib.nullcontext)
    assert isinstance(device_guard(_OnCuda(1)), contextlib.nullcontext)
    guard = device_guard(_OnCuda(0))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 0
