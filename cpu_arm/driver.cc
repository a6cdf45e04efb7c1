// Planning and threading for the CPU linear scan: splits the (outer, L, inner)
// problem into kernel calls (kernel_api.h) and runs them on the executor.
//
// Independent sequences are the first source of parallelism: row groups
// (inner == 1) or (outer, channel tile) pairs (inner > 1). When there are too
// few of them for the threads, or (rows layout) too few rows to fill a vector,
// the scanned axis is cut into chunks and done in three passes:
//   1. reduce: each chunk but the last in scan order, from h = 0, p = 1, gives
//      its end state E_c and its a-product P_c (reads a and b, writes nothing);
//   2. carries, sequentially over the chunks of each sequence:
//      carry_0 = h0, carry_{c+1} = P_c * carry_c + E_c (and the a-product);
//   3. scan every chunk again from its carry, writing h (and a_prod).
// Chunks of one row are themselves independent rows of the rows kernel, so a
// single long sequence still runs vectorised and on every thread.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "dtypes.h"
#include "linear_scan_cpu.h"

namespace jax_selscan {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Elements per parallel task: enough that handing it to another thread
// (microseconds) is noise.
constexpr int64_t kTaskElements = int64_t(1) << 15;
// The chunked path reads a and b twice (reduce + scan): it is taken only when
// the work model says it beats the plain one even with this factor.
constexpr double kChunkedCost = 1.8;
constexpr int64_t kMinChunk = 64;  // steps per chunk

// nf chunks of `len` steps, then (when L is not a multiple) one of `rem` < nf steps.
struct Chunks {
  int64_t nf, len, rem, nc;
  Chunks(int64_t length, int64_t nfull)
      : nf(nfull), len(length / nfull), rem(length - nfull * (length / nfull)),
        nc(nfull + (rem > 0 ? 1 : 0)) {}
};

template <class T>
class Driver {
  using Info = ElemInfo<T>;
  using Lane = typename Info::Lane;
  static constexpr int kPer = Info::kPer;

 public:
  Driver(const LinearScanArgs& args, const KernelTable& kernels, Executor& ex)
      : A(args), ex_(ex), rows_fn_(kernels.rows[int(args.dtype)]),
        strided_fn_(kernels.strided[int(args.dtype)]),
        rows_per_group_(kernels.rows_per_group[int(args.dtype)]),
        tile_(kernels.tile[int(args.dtype)]), wide_(kernels.wide[int(args.dtype)]) {}

  void run() {
    if (A.outer <= 0 || A.length <= 0 || A.inner <= 0) return;
    const int64_t total = A.outer * A.length * A.inner;
    threads_ = total < kMinParallelElements ? 1 : std::max<int64_t>(1, ex_.num_threads());
    if (A.inner == 1) run_rows();
    else run_strided();
  }

 private:
  const LinearScanArgs& A;
  Executor& ex_;
  KernelFn rows_fn_, strided_fn_;
  int64_t rows_per_group_, tile_, wide_;
  int64_t threads_ = 1;
  std::unique_ptr<Lane[]> st_h_, st_p_;  // per (outer, chunk, channel) state, kPer lanes each

  const T* a_at(int64_t off) const { return static_cast<const T*>(A.a) + off; }
  const T* b_at(int64_t off) const { return static_cast<const T*>(A.b) + off; }
  T* h_at(int64_t off) const { return static_cast<T*>(A.h) + off; }
  T* p_at(int64_t off) const { return A.a_prod ? static_cast<T*>(A.a_prod) + off : nullptr; }

  ScanTask task(Mode mode, int64_t off, int64_t n, int64_t ld, int64_t count, int64_t seq_stride,
                int64_t slot0, int64_t slot_stride) const {
    ScanTask t;
    t.a = a_at(off);
    t.b = b_at(off);
    t.h = h_at(off);
    t.p = p_at(off);
    t.n = n;
    t.ld = ld;
    t.count = count;
    t.seq_stride = seq_stride;
    t.h0 = A.h0;
    t.st_h = st_h_.get();
    t.st_p = st_p_.get();
    t.slot0 = slot0;
    t.slot_stride = slot_stride;
    t.mode = mode;
    t.reverse = A.reverse;
    return t;
  }

  // Runs kernel calls make(0 .. ncalls-1), about `work` elements each, batched
  // into tasks of >= kTaskElements but no fewer than ~4 tasks per thread.
  template <class Make>
  void run_calls(int64_t ncalls, int64_t work, KernelFn fn, const Make& make) {
    if (ncalls <= 0) return;
    if (threads_ <= 1) {
      for (int64_t i = 0; i < ncalls; ++i) fn(make(i));
      return;
    }
    int64_t per_task = std::max<int64_t>(1, ceil_div(kTaskElements, std::max<int64_t>(1, work)));
    per_task = std::min(per_task, std::max<int64_t>(1, ncalls / (4 * threads_)));
    const int64_t ntasks = ceil_div(ncalls, per_task);
    ex_.parallel_for(ntasks, [&](int64_t k) {
      const int64_t end = std::min(ncalls, (k + 1) * per_task);
      for (int64_t i = k * per_task; i < end; ++i) fn(make(i));
    });
  }

  void alloc_state(int64_t slots) {
    st_h_.reset(new Lane[size_t(slots * kPer)]);
    st_p_.reset(new Lane[size_t(slots * kPer)]);
  }

  // Pass 2: turns the (E_c, P_c) of every chunk into the chunk's starting
  // state, walking the chunks of each (outer, channel) in scan order.
  void carries(const Chunks& ch) {
    Lane* sh = st_h_.get();
    Lane* sp = st_p_.get();
    for (int64_t o = 0; o < A.outer; ++o) {
      for (int64_t j = 0; j < A.inner; ++j) {
        Lane h[2] = {Lane(0), Lane(0)}, p[2] = {Lane(1), Lane(0)};
        if (A.h0 != nullptr) Info::to_lanes(static_cast<const T*>(A.h0) + o * A.inner + j, 1, h);
        for (int64_t s = 0; s < ch.nc; ++s) {
          const int64_t c = A.reverse ? ch.nc - 1 - s : s;
          Lane* eh = sh + ((o * ch.nc + c) * A.inner + j) * kPer;
          Lane* ep = sp + ((o * ch.nc + c) * A.inner + j) * kPer;
          Lane E[2] = {eh[0], kPer == 2 ? eh[1] : Lane(0)};
          Lane P[2] = {ep[0], kPer == 2 ? ep[1] : Lane(0)};
          for (int k = 0; k < kPer; ++k) { eh[k] = h[k]; ep[k] = p[k]; }
          if (s == ch.nc - 1) break;  // the last chunk's (E, P) were never computed
          if constexpr (kPer == 2) {  // complex: h = P*h + E, p = P*p
            const Lane hr = P[0] * h[0] - P[1] * h[1] + E[0], hi = P[0] * h[1] + P[1] * h[0] + E[1];
            const Lane pr = P[0] * p[0] - P[1] * p[1], pi = P[0] * p[1] + P[1] * p[0];
            h[0] = hr; h[1] = hi; p[0] = pr; p[1] = pi;
          } else {
            h[0] = P[0] * h[0] + E[0];
            p[0] = P[0] * p[0];
          }
        }
      }
    }
  }

  // ------------------------------------------------------------- rows layout
  void run_rows() {
    const int64_t L = A.length, outer = A.outer, R = rows_per_group_;
    // Work model, in "group steps": a row group costs L steps however many of its rows are real.
    const double plain = double(ceil_div(ceil_div(outer, R), threads_)) * double(L);
    const int64_t kmax = L / (R * kMinChunk);  // chunk groups per row, chunks >= kMinChunk
    const int64_t k = std::min(kmax, std::max<int64_t>(1, ceil_div(4 * threads_, outer)));
    if (k >= 1) {
      const int64_t nf = k * R;
      const double chunked = kChunkedCost * double(ceil_div(outer * k, threads_)) * double(L / nf);
      if (chunked < plain) return rows_chunked(Chunks(L, nf));
    }
    const int64_t groups = ceil_div(outer, R);
    run_calls(groups, R * L, rows_fn_, [&](int64_t g) {
      const int64_t o0 = g * R;
      return task(Mode::kScan, o0 * L, L, 1, std::min(R, outer - o0), L, o0, 1);
    });
  }

  // Chunks of each row are rows of the rows kernel: the full ones (stride len)
  // in groups of R per outer row, the short remainder chunks across outer rows.
  void rows_chunked(const Chunks& ch) {
    const int64_t L = A.length, outer = A.outer, R = rows_per_group_;
    alloc_state(outer * ch.nc);
    auto pass = [&](Mode mode, int64_t c_lo, int64_t c_hi) {  // chunks [c_lo, c_hi)
      const int64_t f_hi = std::min(c_hi, ch.nf);
      const int64_t per_row = f_hi > c_lo ? ceil_div(f_hi - c_lo, R) : 0;
      const int64_t nfull = outer * per_row;
      const bool with_rem = ch.rem > 0 && c_hi > ch.nf;
      const int64_t nrem = with_rem ? ceil_div(outer, R) : 0;
      run_calls(nfull + nrem, R * ch.len, rows_fn_, [&](int64_t i) {
        if (i < nfull) {
          const int64_t o = i / per_row, c0 = c_lo + (i % per_row) * R;
          return task(mode, o * L + c0 * ch.len, ch.len, 1, std::min(R, f_hi - c0), ch.len,
                      o * ch.nc + c0, 1);
        }
        const int64_t o0 = (i - nfull) * R;
        return task(mode, o0 * L + ch.nf * ch.len, ch.rem, 1, std::min(R, outer - o0), L,
                    o0 * ch.nc + ch.nf, ch.nc);
      });
    };
    // Pass 1 skips the chunk that comes last in scan order.
    if (A.reverse) pass(Mode::kReduce, 1, ch.nc);
    else pass(Mode::kReduce, 0, ch.nc - 1);
    carries(ch);
    pass(Mode::kScanFromState, 0, ch.nc);
  }

  // ---------------------------------------------------------- strided layout
  void run_strided() {
    const int64_t L = A.length, outer = A.outer, inner = A.inner, W = tile_;
    const int64_t tiles = ceil_div(inner, W), units = outer * tiles;
    if (threads_ > 1) {
      const int64_t nf = std::min(L / kMinChunk, ceil_div(4 * threads_, units));
      if (nf >= 2) {
        const double plain = double(ceil_div(units, threads_)) * double(L);
        const double chunked = kChunkedCost * double(ceil_div(units * nf, threads_)) * double(L / nf);
        if (chunked < plain) return strided_chunked(Chunks(L, nf));
      }
    }
    strided_pass(Mode::kScan, 1, 0, 1, L, 0);
  }

  // One pass over chunks [c_lo, c_hi) of every (outer, channel block). Chunk c
  // starts at step c * len (nc == 1, len == L: the whole axis). Channel blocks
  // are the kernel's wide blocks when the channels allow (one contiguous run of
  // up to 16 KiB per step), narrowed until there is one per thread.
  void strided_pass(Mode mode, int64_t nc, int64_t c_lo, int64_t c_hi, int64_t len, int64_t rem) {
    const int64_t L = A.length, outer = A.outer, inner = A.inner, nchunks = c_hi - c_lo;
    int64_t block = inner >= wide_ / 8 ? std::min(inner, wide_) : tile_;
    // Measured (docs/PERFORMANCE_CPU.md): wider runs per step beat finer load
    // balancing, so split only until every thread has one block.
    const int64_t min_block = block >= wide_ / 8 ? wide_ / 8 : tile_;
    while (block / 2 >= min_block && outer * nchunks * ceil_div(inner, block) < threads_)
      block /= 2;
    // Calls of narrow blocks are batched into tasks by run_calls.
    const int64_t blocks = ceil_div(inner, block);
    run_calls(outer * nchunks * blocks, std::min(block, inner) * len, strided_fn_, [&](int64_t i) {
      const int64_t blk = i % blocks, c = c_lo + (i / blocks) % nchunks, o = i / (blocks * nchunks);
      const int64_t j0 = blk * block, t0 = c * len;
      const int64_t n = (rem > 0 && c == nc - 1) ? rem : len;
      return task(mode, (o * L + t0) * inner + j0, n, inner, std::min(block, inner - j0), 1,
                  (o * nc + c) * inner + j0, 1);
    });
  }

  void strided_chunked(const Chunks& ch) {
    alloc_state(A.outer * ch.nc * A.inner);
    if (A.reverse) strided_pass(Mode::kReduce, ch.nc, 1, ch.nc, ch.len, ch.rem);
    else strided_pass(Mode::kReduce, ch.nc, 0, ch.nc - 1, ch.len, ch.rem);
    carries(ch);
    strided_pass(Mode::kScanFromState, ch.nc, 0, ch.nc, ch.len, ch.rem);
  }
};

}  // namespace

void linear_scan_cpu(const LinearScanArgs& args, const KernelTable& kernels, Executor& executor) {
  switch (args.dtype) {
    case DType::kF32: Driver<float>(args, kernels, executor).run(); break;
    case DType::kF64: Driver<double>(args, kernels, executor).run(); break;
    case DType::kC64: Driver<c64_t>(args, kernels, executor).run(); break;
    case DType::kBF16: Driver<bf16_t>(args, kernels, executor).run(); break;
    case DType::kF16: Driver<f16_t>(args, kernels, executor).run(); break;
  }
}

}  // namespace jax_selscan
