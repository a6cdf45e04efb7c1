// XLA FFI handlers of linear_scan on CUDA and the nanobind module jax_selscan._cuda.
//
//   jax_selscan_linear_scan       (a, b, h0) -> h
//   jax_selscan_linear_scan_prod  (a, b, h0) -> (h, a_prod)
// attributes: axis (int64), reverse (bool), algorithm (int64, index into
// primitives.ALGORITHMS). The kernels run on the stream XLA passes in. Scratch (tile
// status words, carries) is stream-ordered: cudaMallocFromPoolAsync on that stream from a
// per-device pool of our own, reset there (cudaMemsetAsync) before every launch, and
// released with cudaFreeAsync on the same stream after the last kernel, so it is never
// reused while a kernel still reads it. (XLA's FFI ScratchAllocator, present in the jax
// 0.10.2 and 0.12 headers, returned an error on jax 0.11.2 / CUDA 13 on the H200, so it is
// not used.) The handlers are NOT declared command-buffer (CUDA graph) compatible: that has
// not been tested here.
#include <cstdint>
#include <mutex>
#include <string>

#include <nanobind/nanobind.h>

#include "linear_scan.h"
#include "scratch.h"
#include "selective_scan.h"
#include "selective_scan_ffi.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace jss {

// One memory pool per device, created on first use. It keeps what it has mapped (release
// threshold: unlimited), as a caching allocator does: with a 256 MiB threshold the selective
// scan's backward scratch (0.3-1 GB at Mamba sizes: checkpoints and dB/dC partials) was
// unmapped at every synchronisation and mapped again by the next call.
static cudaError_t scratch_pool(int dev, cudaMemPool_t* out) {
  static std::mutex mu;
  static cudaMemPool_t pools[128] = {};
  if (dev < 0 || dev >= 128) return cudaErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(mu);
  if (!pools[dev]) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t pool;
    cudaError_t err = cudaMemPoolCreate(&pool, &props);
    if (err != cudaSuccess) return err;
    uint64_t keep = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    pools[dev] = pool;
  }
  *out = pools[dev];
  return cudaSuccess;
}

cudaError_t scratch_alloc(cudaStream_t stream, size_t bytes, void** out) {
  *out = nullptr;
  if (!bytes) return cudaSuccess;
  int dev = 0;
  cudaError_t err = cudaStreamGetDevice(stream, &dev);
  if (err == cudaSuccess) err = cudaSetDevice(dev);
  cudaMemPool_t pool;
  if (err == cudaSuccess) err = scratch_pool(dev, &pool);
  if (err == cudaSuccess) err = cudaMallocFromPoolAsync(out, bytes, pool, stream);
  return err;
}

}  // namespace jss

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

bool same_dims(const ffi::AnyBuffer& x, const ffi::AnyBuffer& y) {
  auto dx = x.dimensions(), dy = y.dimensions();
  if (dx.size() != dy.size()) return false;
  for (size_t i = 0; i < dx.size(); ++i)
    if (dx[i] != dy[i]) return false;
  return true;
}

ffi::Error Run(cudaStream_t stream, const ffi::AnyBuffer& a,
               const ffi::AnyBuffer& b, const ffi::AnyBuffer& h0, ffi::AnyBuffer* h, ffi::AnyBuffer* aprod,
               int64_t axis, bool reverse, int64_t algorithm) {
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
  const size_t bytes = jss::scratch_bytes(t, p);
  cudaError_t err = jss::with_scratch(
      stream, bytes, [&](void* buf) { return jss::launch_linear_scan(t, p, buf, stream); });
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string("linear_scan (CUDA): ") + cudaGetErrorString(err));
  return ffi::Error::Success();
}

ffi::Error LinearScanImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                          ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer> h, int64_t axis, bool reverse,
                          int64_t algorithm) {
  return Run(stream, a, b, h0, &*h, nullptr, axis, reverse, algorithm);
}

ffi::Error LinearScanProdImpl(cudaStream_t stream, ffi::AnyBuffer a,
                              ffi::AnyBuffer b, ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer> h,
                              ffi::Result<ffi::AnyBuffer> aprod, int64_t axis, bool reverse, int64_t algorithm) {
  return Run(stream, a, b, h0, &*h, &*aprod, axis, reverse, algorithm);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssLinearScanCuda, LinearScanImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("axis")
                                  .Attr<bool>("reverse")
                                  .Attr<int64_t>("algorithm"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JssLinearScanProdCuda, LinearScanProdImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("axis")
                                  .Attr<bool>("reverse")
                                  .Attr<int64_t>("algorithm"));

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
  m.def("resolve_algorithm", [](int64_t outer, int64_t L, int64_t inner) {
    jss::ScanProblem p;
    p.outer = outer;
    p.L = L;
    p.inner = inner;
    return jss::resolve_algorithm(p);
  });
  m.def("selective_scan_geometry", [](int64_t N, int64_t rows) {
    return nb::make_tuple(jss::ss_states_per_thread(N, rows), jss::ss_lanes_per_row(N, rows));
  });
}
