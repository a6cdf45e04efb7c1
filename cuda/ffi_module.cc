// XLA FFI handlers of linear_scan on CUDA and the nanobind module jax_selscan._cuda.
//
//   jax_selscan_linear_scan       (a, b, h0) -> (h, scratch)
//   jax_selscan_linear_scan_prod  (a, b, h0) -> (h, a_prod, scratch)
// attributes: axis (int64), reverse (bool), algorithm (int64, index into
// primitives.ALGORITHMS). The kernels run on the stream XLA passes in. `scratch` (tile
// status words, carries, the tile counter) is a 1-D uint8 result that Python sizes at trace
// time with linear_scan_scratch_bytes() plus kScratchAlign bytes (XLA does not promise the
// 256-byte alignment the kernels need, so the handler aligns the pointer up); the caller
// drops it. The kernels reset it on the stream (cudaMemsetAsync) before every launch,
// so nothing is allocated in the call and the handlers are declared command-buffer (CUDA
// graph) compatible; the selective-scan handlers (selective_scan_ffi.cc) take theirs the same
// way, sized by selective_scan_scratch_bytes() below.
#include <cstdint>
#include <stdexcept>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "../ffi_common/linear_scan_binding.h"
#include "graph_capture.h"
#include "linear_scan.h"
#include "selective_scan.h"
#include "selective_scan_ffi.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace {

bool to_dtype(ffi::DataType t, jss::DType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = jss::DType::F32; return true;
    case ffi::DataType::F64: *out = jss::DType::F64; return true;
    case ffi::DataType::BF16: *out = jss::DType::BF16; return true;
    case ffi::DataType::F16: *out = jss::DType::F16; return true;
    case ffi::DataType::C64: *out = jss::DType::C64; return true;
    default: return false;
  }
}

// The dtype names of numpy / ml_dtypes, mapped as to_dtype maps XLA's element types.
bool dtype_from_name(const std::string& name, jss::DType* out) {
  if (name == "float32") *out = jss::DType::F32;
  else if (name == "float64") *out = jss::DType::F64;
  else if (name == "bfloat16") *out = jss::DType::BF16;
  else if (name == "float16") *out = jss::DType::F16;
  else if (name == "complex64") *out = jss::DType::C64;
  else return false;
  return true;
}

bool same_dims(const ffi::AnyBuffer& x, const ffi::AnyBuffer& y) {
  auto dx = x.dimensions(), dy = y.dimensions();
  if (dx.size() != dy.size()) return false;
  for (size_t i = 0; i < dx.size(); ++i)
    if (dx[i] != dy[i]) return false;
  return true;
}

// The kernels' scratch alignment (linear_scan.h); Python adds this much to the request.
constexpr size_t kScratchAlign = 256;

ffi::Error Run(cudaStream_t stream, const ffi::AnyBuffer& a,
               const ffi::AnyBuffer& b, const ffi::AnyBuffer& h0, ffi::AnyBuffer* h, ffi::AnyBuffer* aprod,
               ffi::AnyBuffer* scratch, int64_t axis, bool reverse, int64_t algorithm) {
  jss::DType t;
  if (!to_dtype(a.element_type(), &t))
    return ffi::Error::InvalidArgument("linear_scan (CUDA): unsupported dtype");
  if (b.element_type() != a.element_type() || h0.element_type() != a.element_type() ||
      h->element_type() != a.element_type() || (aprod && aprod->element_type() != a.element_type()))
    return ffi::Error::InvalidArgument("linear_scan (CUDA): a, b, h0 and the results must share a dtype");
  if (!same_dims(a, b) || !same_dims(a, *h) || (aprod && !same_dims(a, *aprod)))
    return ffi::Error::InvalidArgument("linear_scan (CUDA): a, b and the results must have one shape");
  auto dims = a.dimensions();
  const int64_t rank = static_cast<int64_t>(dims.size());
  if (axis < 0 || axis >= rank) return ffi::Error::InvalidArgument("linear_scan (CUDA): axis out of range");
  if (algorithm < 0 || algorithm >= jss::kNumAlgorithms)
    return ffi::Error::InvalidArgument("linear_scan (CUDA): unknown algorithm index");
  auto hd = h0.dimensions();
  if (static_cast<int64_t>(hd.size()) != rank - 1)
    return ffi::Error::InvalidArgument("linear_scan (CUDA): h0 must have rank ndim - 1");
  jss::ScanProblem p;
  p.outer = 1;
  p.inner = 1;
  for (int64_t i = 0, j = 0; i < rank; ++i) {
    if (i == axis) continue;
    if (hd[j++] != dims[i]) return ffi::Error::InvalidArgument("linear_scan (CUDA): h0 has the wrong shape");
  }
  for (int64_t i = 0; i < axis; ++i) p.outer *= dims[i];
  p.L = dims[axis];
  for (int64_t i = axis + 1; i < rank; ++i) p.inner *= dims[i];
  p.a = a.untyped_data();
  p.b = b.untyped_data();
  p.h0 = h0.untyped_data();
  p.h = h->untyped_data();
  p.aprod = aprod ? aprod->untyped_data() : nullptr;
  p.reverse = reverse;
  p.algorithm = static_cast<int>(algorithm);
  if (p.outer == 0 || p.L == 0 || p.inner == 0) return ffi::Error::Success();  // empty
  jss::note_capture(stream);
  const size_t bytes = jss::scratch_bytes(t, p);
  void* buf = nullptr;
  if (bytes) {
    // Never write past the buffer: it was sized in Python, this is the plan actually run.
    const uintptr_t base = reinterpret_cast<uintptr_t>(scratch->untyped_data());
    const uintptr_t pad = (kScratchAlign - base % kScratchAlign) % kScratchAlign;
    const size_t have = scratch->size_bytes();
    if (!base || have < pad || have - pad < bytes)
      return ffi::Error::InvalidArgument(
          "linear_scan (CUDA): scratch result too small: " + std::to_string(have) + " bytes at offset " +
          std::to_string(pad) + " from 256-byte alignment, the launch needs " + std::to_string(bytes));
    buf = reinterpret_cast<void*>(base + pad);
  }
  cudaError_t err = jss::launch_linear_scan(t, p, buf, stream);
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string("linear_scan (CUDA): ") + cudaGetErrorString(err));
  return ffi::Error::Success();
}

ffi::Error LinearScanImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                          ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer> h,
                          ffi::Result<ffi::AnyBuffer> scratch, int64_t axis, bool reverse, int64_t algorithm) {
  return Run(stream, a, b, h0, &*h, nullptr, &*scratch, axis, reverse, algorithm);
}

ffi::Error LinearScanProdImpl(cudaStream_t stream, ffi::AnyBuffer a,
                              ffi::AnyBuffer b, ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer> h,
                              ffi::Result<ffi::AnyBuffer> aprod, ffi::Result<ffi::AnyBuffer> scratch,
                              int64_t axis, bool reverse, int64_t algorithm) {
  return Run(stream, a, b, h0, &*h, &*aprod, &*scratch, axis, reverse, algorithm);
}

// The shared operands and attributes (ffi_common/linear_scan_binding.h), with the scratch
// result last among the results.
template <bool kProd>
auto bind_linear_scan_cuda() {
  return jss_ffi::with_ls_attrs(
      jss_ffi::bind_ls<ffi::PlatformStream<cudaStream_t>, kProd>().template Ret<ffi::AnyBuffer>());  // scratch
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssLinearScanCuda, LinearScanImpl, bind_linear_scan_cuda<false>(),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssLinearScanProdCuda, LinearScanProdImpl, bind_linear_scan_cuda<true>(),
                              {ffi::Traits::kCmdBufferCompatible});

NB_MODULE(_cuda, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["jax_selscan_linear_scan"] = nb::capsule(reinterpret_cast<void*>(JssLinearScanCuda));
    d["jax_selscan_linear_scan_prod"] = nb::capsule(reinterpret_cast<void*>(JssLinearScanProdCuda));
    d["jax_selscan_selective_scan_fwd"] = nb::capsule(reinterpret_cast<void*>(JssSelectiveScanFwdCuda));
    d["jax_selscan_selective_scan_bwd"] = nb::capsule(reinterpret_cast<void*>(JssSelectiveScanBwdCuda));
    d["jax_selscan_selective_scan_fwd_ckpt"] = nb::capsule(reinterpret_cast<void*>(JssSelectiveScanFwdCkptCuda));
    return d;
  });
  // Test hooks: the resolved algorithm and the scratch size for a shape (no GPU needed).
  m.def(
      "resolve_algorithm",
      [](int64_t outer, int64_t L, int64_t inner, int elem_bytes) {
        jss::ScanProblem p;
        p.outer = outer;
        p.L = L;
        p.inner = inner;
        return jss::resolve_algorithm(p, elem_bytes);
      },
      nb::arg("outer"), nb::arg("L"), nb::arg("inner"), nb::arg("elem_bytes") = 4);
  // row_walk's rows per warp for `outer` rows of L elements, as a launch would take it, or
  // (rule=True) the rule alone (test hook; no device query).
  m.def("row_walk_rows_per_warp", &jss::row_walk_rows_per_warp, nb::arg("outer"), nb::arg("L"),
        nb::arg("elem_bytes") = 4, nb::arg("rule") = false);
  // row_walk's cap on the one-warp blocks an SM holds, as a launch would take it (0: none;
  // test hook; no device query).
  m.def("row_walk_warps_per_sm", &jss::row_walk_warps_per_sm);
  // Bytes the scratch result of one call must hold (before kScratchAlign is added), for the
  // (outer, L, inner) view that Run builds. Depends on shape, dtype and algorithm only (no
  // device query), and on the operands' 16-byte alignment (strided_stage needs 16-byte
  // vectors, else the plan falls back to lookback_regs): this returns the larger of both
  // plans. XLA's buffers are >= 16-byte aligned; Run still checks the size it is given.
  m.def("linear_scan_scratch_bytes", [](const std::string& dtype_name, int64_t outer, int64_t L,
                                        int64_t inner, bool reverse, int64_t algorithm) {
    jss::DType t;
    if (!dtype_from_name(dtype_name, &t)) throw nb::value_error(("unsupported dtype " + dtype_name).c_str());
    if (algorithm < 0 || algorithm >= jss::kNumAlgorithms) throw nb::value_error("unknown algorithm index");
    if (outer < 0 || L < 0 || inner < 0) throw nb::value_error("negative extent");
    jss::ScanProblem p;
    p.outer = outer;
    p.L = L;
    p.inner = inner;
    p.reverse = reverse;
    p.algorithm = static_cast<int>(algorithm);
    if (p.outer == 0 || p.L == 0 || p.inner == 0) return size_t{0};  // Run launches nothing
    const size_t aligned = jss::scratch_bytes(t, p);  // null pointers: every alignment test passes
    p.a = reinterpret_cast<const void*>(uintptr_t{8});  // never dereferenced, only its low bits read
    const size_t unaligned = jss::scratch_bytes(t, p);
    return aligned > unaligned ? aligned : unaligned;
  });
  m.def("linear_scan_scratch_align", []() { return kScratchAlign; });
  // GPU test hook: how many handler calls (linear and selective scan) ran while XLA was
  // recording them into a CUDA graph (graph_capture.h).
  m.def("captured_calls", []() { return jss::captured_calls().load(); });
  // GPU test hook: the kernel family a call of this shape runs on the current device, after
  // the fallbacks of a GPU with less shared memory per block (operands taken as aligned).
  m.def("launched_algorithm", [](const std::string& dtype_name, int64_t outer, int64_t L, int64_t inner) {
    jss::DType t;
    if (!dtype_from_name(dtype_name, &t)) throw nb::value_error(("unsupported dtype " + dtype_name).c_str());
    jss::ScanProblem p;
    p.outer = outer;
    p.L = L;
    p.inner = inner;
    int algo = -1;
    const cudaError_t err = jss::launched_algorithm(t, p, algo);
    if (err != cudaSuccess) throw std::runtime_error(cudaGetErrorString(err));
    return algo;
  });
  // Bytes of scratch the selective-scan forward (backward=False) or backward plans for a
  // problem (before kScratchAlign is added): the L split's carries, the bidirectional y, the
  // backward's dB / dC partials, its checkpoint sweep unless the forward saved them
  // (saved_ckpt). groups_b / groups_c: G of a varying (batch, G, N, L) operand, 0 for a
  // time-invariant one. The plan reads the current device's SM count (132 without one) and
  // the JAX_SELSCAN_SS_* variables, as the handler does when it runs.
  m.def("selective_scan_scratch_bytes", [](bool backward, int64_t batch, int64_t dim, int64_t L, int64_t N,
                                           int64_t groups_b, int64_t groups_c, int64_t direction,
                                           bool has_h0, bool saved_ckpt) {
    if (batch < 0 || dim < 0 || L < 0 || N < 0 || groups_b < 0 || groups_c < 0)
      throw nb::value_error("negative extent");
    if (direction < 0 || direction > 2) throw nb::value_error("direction must be 0, 1 or 2");
    jss::SsProblem p;
    p.batch = batch;
    p.dim = dim;
    p.L = L;
    p.N = N;
    p.groups_b = groups_b;
    p.groups_c = groups_c;
    p.direction = static_cast<int>(direction);
    static const float one = 1.f;  // only whether h0 is given matters to the plan
    p.h0 = has_h0 ? &one : nullptr;
    if (!jss::ss_supported(p)) return size_t{0};  // the handler rejects it before planning
    return backward ? jss::ss_backward_scratch_bytes(p, saved_ckpt) : jss::ss_forward_scratch_bytes(p);
  });
  // The L split of a (batch, D, L, N) problem with varying B and C (one group), forward
  // direction, on this process's GPU (132 SMs, an H200's, when there is none): (forward chunks,
  // phase A sub-chunks per forward chunk, backward chunks, sub-chunks per backward chunk).
  m.def("selective_scan_split_plan", [](int64_t batch, int64_t dim, int64_t L, int64_t N) {
    if (batch < 1 || dim < 1 || L < 1 || N < 1 || N > 128) throw nb::value_error("unsupported problem");
    jss::SsProblem p;
    p.batch = batch;
    p.dim = dim;
    p.L = L;
    p.N = N;
    p.groups_b = p.groups_c = 1;
    const jss::SsPlan f = jss::ss_plan(p, false), b = jss::ss_plan(p, true, true);
    return nb::make_tuple(f.nch, f.sub, b.bnch, b.bsub);
  });
  // The staged forward's lanes per row at N <= 16 for a grid of `blocks` on `sms` SMs holding
  // per_sm4 / per_sm8 blocks of 4 / 8 lanes (ss_staged_fwd_lanes; the kernels ask the GPU), for
  // elements of elem_bytes.
  m.def("selective_scan_staged_lanes", [](int64_t blocks, int64_t sms, int per_sm4, int per_sm8, bool ys, bool plain,
                                          int elem_bytes) {
    if (blocks < 1 || sms < 1 || per_sm4 < 1 || per_sm8 < 1) throw nb::value_error("unsupported grid");
    if (elem_bytes != 2 && elem_bytes != 4) throw nb::value_error("elem_bytes must be 2 or 4");
    return jss::ss_staged_fwd_lanes(blocks, sms, per_sm4, per_sm8, ys, plain, elem_bytes);
  });
  m.def("selective_scan_geometry", [](int64_t N, int64_t rows) {
    return nb::make_tuple(jss::ss_states_per_thread(N, rows), jss::ss_lanes_per_row(N, rows));
  });
}
