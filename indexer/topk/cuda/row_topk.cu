// Exact per-row top-k of short rows, one thread block a row, the row held in registers.
//
// Each block loads its row's window once (coalesced: key j of thread t is column t + j * threads), maps every
// float to a 32-bit key whose unsigned order is the floats' order (NaN above every number,
// -0.0 equal to +0.0, as the Triton kernels and torch.topk rank them), and finds the k-th
// largest key by a radix select over the keys in registers: a histogram of the top 11 bits
// in shared memory, then of the next 11 among the keys of the chosen bin, then of the last
// 10; it stops at the first pass whose bin is needed whole, and early where the keys of the
// chosen bin are all one value (a bin much fuller than needed after the first pass, or one a
// pass did not narrow: rows of equal keys, of a few values, of zeros). The write places each selected
// key's column by a block scan of the threads' counts (deterministic, no atomics decide a
// position), staged in shared memory and copied out in order; keys tied at the k-th value
// are taken lowest column first.
//
// Shared-memory histograms are kept in COPIES replicas (a thread adds to replica
// tid % COPIES) and each thread first merges runs of equal bins in its own keys: rows of one
// value, or of a few, would otherwise serialize the atomics on one address.

#include <cstdint>
#include <cub/block/block_scan.cuh>

namespace indexer_row_topk {

constexpr int BINS = 2048;
constexpr int COPIES = 4;
// a replica's stride: one past the bins, so that one bin's replicas sit in different banks
constexpr int STRIDE = BINS + 1;

__device__ __forceinline__ uint32_t ukey(float v) {
  uint32_t b = __float_as_uint(v);
  if (b == 0x80000000u) b = 0u;     // -0.0 ties +0.0
  if (v != v) b = 0x7FFFFFFFu;      // every NaN above every number
  uint32_t k = b ^ (static_cast<uint32_t>(static_cast<int32_t>(b) >> 31) & 0x7FFFFFFFu);
  return k ^ 0x80000000u;           // 0 never occurs for a real key: it marks an empty slot
}

template <int THREADS, int SLOTS>
__device__ __forceinline__ void count_digits(const uint32_t (&keys)[SLOTS], int* hist, uint32_t prefix,
                                             int prefix_shift, int shift, uint32_t mask) {
  const int copy = (threadIdx.x & (COPIES - 1)) * STRIDE;
  uint32_t cur = 0xFFFFFFFFu;
  int run = 0;
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) {
    const uint32_t k = keys[j];
    // prefix_shift == 32: the first pass, every real key counts
    const bool in = k != 0u && (prefix_shift == 32 || (k >> prefix_shift) == prefix);
    if (in) {
      const uint32_t bin = (k >> shift) & mask;
      if (bin == cur) {
        ++run;
      } else {
        if (run) atomicAdd(hist + copy + cur, run);
        cur = bin;
        run = 1;
      }
    }
  }
  if (run) atomicAdd(hist + copy + cur, run);
}

template <int THREADS, int SLOTS, typename Idx>
__global__ void __launch_bounds__(THREADS, THREADS <= 512 ? 2 : 1) row_topk_kernel(const float* __restrict__ logits, int64_t row_stride,
                                                          const Idx* __restrict__ starts,
                                                          const Idx* __restrict__ lengths, int32_t* __restrict__ out,
                                                          int64_t out_stride, int k) {
  constexpr int BPT = BINS / THREADS;
  constexpr int WARPS = THREADS / 32;
  static_assert(SLOTS <= 32, "a tie count a thread, a bit of tie_take a slot");
  using Scan = cub::BlockScan<int, THREADS>;
  __shared__ int hist[COPIES * STRIDE];
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int tie_base[SLOTS * WARPS];
  __shared__ uint32_t s_bin, s_lo, s_hi;
  __shared__ int s_above, s_count;

  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int64_t row = blockIdx.x;
  const int64_t len = static_cast<int64_t>(lengths[row]);
  int32_t* orow = out + row * out_stride;
  if (len <= k) {  // every key, then -1
    for (int j = tid; j < k; j += THREADS) orow[j] = j < len ? j : -1;
    return;
  }
  const float* p = logits + row * row_stride + static_cast<int64_t>(starts[row]);

  for (int i = tid; i < COPIES * STRIDE; i += THREADS) hist[i] = 0;
  if (tid == 0) {
    s_lo = 0xFFFFFFFFu;
    s_hi = 0u;
  }

  // slot j of thread t is column t + j * THREADS: every load is one coalesced line a warp
  uint32_t keys[SLOTS];
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) {
    const int c = tid + j * THREADS;
    keys[j] = c < len ? ukey(__ldg(p + c)) : 0u;
  }
  __syncthreads();  // the histogram is zeroed

  // radix select: prefix (the top `width` bits of the k-th key) and need (keys still to take
  // among those with that prefix)
  uint32_t prefix = 0u;
  int width = 0;
  int need = k;
  int prev_count = static_cast<int>(len);
  bool whole = false;  // the last bin is taken whole
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    const int bits = pass == 2 ? 10 : 11;
    const int shift = 32 - width - bits;
    count_digits<THREADS, SLOTS>(keys, hist, prefix, 32 - width, shift, (1u << bits) - 1u);
    __syncthreads();
    // bins in descending order over the threads: an exclusive sum is the count above a bin
    int c[BPT];
    int tot = 0;
#pragma unroll
    for (int j = 0; j < BPT; ++j) {
      const int bin = BINS - 1 - (tid * BPT + j);
      int s = 0;
#pragma unroll
      for (int r = 0; r < COPIES; ++r) s += hist[r * STRIDE + bin];
      c[j] = s;
      tot += s;
    }
    int above;
    Scan(scan_tmp).ExclusiveSum(tot, above);
#pragma unroll
    for (int j = 0; j < BPT; ++j) {
      if (above < need && need <= above + c[j]) {
        s_bin = static_cast<uint32_t>(BINS - 1 - (tid * BPT + j));
        s_above = above;
        s_count = c[j];
      }
      above += c[j];
    }
    __syncthreads();
    prefix = (prefix << bits) | s_bin;
    width += bits;
    need -= s_above;
    const int count = s_count;
    if (count == need) {
      whole = true;
      break;
    }
    if (width == 32) break;
    // One value across the bin ends the select: its remaining passes would only split it
    // again. Checked where that is likely, so that other rows do not pay the extra read of
    // their registers: after the first pass, a bin of over 1/16 of the row and twice the keys
    // still needed (ramps fill a bin to about what is needed); after a later pass, a bin that
    // pass did not narrow.
    if (pass == 0 ? (16 * static_cast<int64_t>(count) > len && count >= 2 * need) : count == prev_count) {
      const int sh = 32 - width;
      uint32_t lo = 0xFFFFFFFFu, hi = 0u;
#pragma unroll
      for (int j = 0; j < SLOTS; ++j) {
        const uint32_t kk = keys[j];
        if (kk != 0u && (kk >> sh) == prefix) {
          lo = min(lo, kk);
          hi = max(hi, kk);
        }
      }
#if __CUDA_ARCH__ >= 800
      lo = __reduce_min_sync(0xFFFFFFFFu, lo);
      hi = __reduce_max_sync(0xFFFFFFFFu, hi);
#else
      for (int o = 16; o; o >>= 1) {
        lo = min(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, o));
        hi = max(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, o));
      }
#endif
      if (lane == 0) {
        atomicMin(&s_lo, lo);
        atomicMax(&s_hi, hi);
      }
      __syncthreads();
      lo = s_lo;
      hi = s_hi;
      if (lo == hi) {
        prefix = lo;
        width = 32;
        break;
      }
    }
    prev_count = count;
    for (int i = tid; i < COPIES * STRIDE; i += THREADS) hist[i] = 0;
    __syncthreads();
    // every thread read s_lo and s_hi before the barrier above: ready for the next check
    if (tid == 0) {
      s_lo = 0xFFFFFFFFu;
      s_hi = 0u;
    }
  }
  // width == 32 unless a pass took its bin whole
  const int pshift = 32 - width;

  // keys tied at the k-th value beyond `need`: the lowest columns first. Column order is
  // (slot, warp, lane): a warp's ties of each slot counted by a ballot, the (slot, warp)
  // counts scanned in that order across the block, one count a thread (SLOTS * WARPS <= THREADS).
  uint32_t tie_take = 0u;  // bit j: slot j's key is a tie taken
  if (!whole) {
#pragma unroll
    for (int j = 0; j < SLOTS; ++j) {
      const uint32_t m = __ballot_sync(0xFFFFFFFFu, keys[j] == prefix);
      if (lane == 0) tie_base[j * WARPS + warp] = __popc(m);
    }
    __syncthreads();
    int t = tid < SLOTS * WARPS ? tie_base[tid] : 0;
    Scan(scan_tmp).ExclusiveSum(t, t);
    if (tid < SLOTS * WARPS) tie_base[tid] = t;
    __syncthreads();
    const uint32_t below = (1u << lane) - 1u;
#pragma unroll
    for (int j = 0; j < SLOTS; ++j) {
      const bool tie = keys[j] == prefix;
      const uint32_t m = __ballot_sync(0xFFFFFFFFu, tie);
      const int r = tie_base[j * WARPS + warp] + __popc(m & below);
      if (tie && r < need) tie_take |= 1u << j;
    }
  }
  const auto selected = [&](int j) -> bool {
    const uint32_t kk = keys[j];
    return whole ? (kk != 0u && (kk >> pshift) >= prefix) : (kk > prefix || ((tie_take >> j) & 1u));
  };
  int mine = 0;
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) mine += selected(j);
  int pos;
  __syncthreads();
  Scan(scan_tmp).ExclusiveSum(mine, pos);
  if (k > COPIES * STRIDE) {
#pragma unroll
    for (int j = 0; j < SLOTS; ++j) {
      if (selected(j)) orow[pos++] = tid + j * THREADS;
    }
    return;
  }
  // the table staged in shared memory (the histogram's), then written out coalesced: each
  // thread's positions are a run of its own, scattered across the row's table
  int* stage = hist;
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) {
    if (selected(j)) stage[pos++] = tid + j * THREADS;
  }
  __syncthreads();
  for (int j = tid; j < k; j += THREADS) orow[j] = stage[j];
}

}  // namespace indexer_row_topk

// (threads, keys a thread): the shapes compiled
#define INDEXER_ROW_TOPK_SHAPES(X) X(256, 16) X(512, 16) X(1024, 16) X(512, 32) X(1024, 24) X(1024, 32)

template <typename Idx>
static int launch_typed(int threads, int slots, int64_t rows, const float* logits, int64_t row_stride, const Idx* starts,
                        const Idx* lengths, int32_t* out, int64_t out_stride, int k, cudaStream_t stream) {
#define INDEXER_ROW_TOPK_CASE(T, V)                                                                     \
  if (threads == T && slots == V) {                                                                      \
    indexer_row_topk::row_topk_kernel<T, V, Idx>                                                       \
        <<<static_cast<unsigned>(rows), T, 0, stream>>>(logits, row_stride, starts, lengths, out, out_stride, k); \
    return static_cast<int>(cudaGetLastError());                                                       \
  }
  INDEXER_ROW_TOPK_SHAPES(INDEXER_ROW_TOPK_CASE)
#undef INDEXER_ROW_TOPK_CASE
  return -1;
}

// Launches the kernel on `stream`; every pointer is a device address. Returns a cudaError_t
// (0: launched), or -1 for a (threads, slots) pair that was not compiled.
extern "C" int indexer_row_topk_launch(int threads, int slots, int index_bytes, int64_t rows, const void* logits,
                                       int64_t row_stride, const void* starts, const void* lengths, void* out,
                                       int64_t out_stride, int k, void* stream) {
  if (rows == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (index_bytes == 4)
    return launch_typed<int32_t>(threads, slots, rows, static_cast<const float*>(logits), row_stride,
                                 static_cast<const int32_t*>(starts), static_cast<const int32_t*>(lengths),
                                 static_cast<int32_t*>(out), out_stride, k, s);
  return launch_typed<int64_t>(threads, slots, rows, static_cast<const float*>(logits), row_stride,
                               static_cast<const int64_t*>(starts), static_cast<const int64_t*>(lengths),
                               static_cast<int32_t*>(out), out_stride, k, s);
}
