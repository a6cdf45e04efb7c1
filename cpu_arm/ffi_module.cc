// XLA FFI handlers for linear_scan on CPU, and the nanobind module
// jax_selscan._cpu that hands them to JAX (jax_selscan/_ffi.py registers them).
//
//   jax_selscan_linear_scan       (a, b, h0) -> h
//   jax_selscan_linear_scan_prod  (a, b, h0) -> (h, a_prod)
//   attributes: axis (int64), reverse (bool), algorithm (int64, CUDA only: ignored)
//
// Work runs on XLA's intra-op thread pool (ffi::ThreadPool): the calling
// thread plus at most num_threads - 1 pool tasks, so a call never uses more
// threads than the pool has.
#include <cstdint>
#include <memory>
#include <new>
#include <string>

#include "../ffi_common/linear_scan_binding.h"
#include "linear_scan_cpu.h"
#include "huge_pages.h"
#include "pool_executor.h"
#include "selective_scan_cpu.h"  // select_ss_table (ss_lanes)
#include "nanobind/nanobind.h"
#include "nanobind/stl/string.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace nb = nanobind;

namespace jax_selscan {
namespace {

ffi::Error to_dtype(ffi::DataType t, DType* out) {
  switch (t) {
    case ffi::F32: *out = DType::kF32; return ffi::Error::Success();
    case ffi::F64: *out = DType::kF64; return ffi::Error::Success();
    case ffi::C64: *out = DType::kC64; return ffi::Error::Success();
    case ffi::BF16: *out = DType::kBF16; return ffi::Error::Success();
    case ffi::F16: *out = DType::kF16; return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument(
          "jax_selscan linear_scan (CPU): unsupported dtype (XLA element type " +
          std::to_string(static_cast<int>(t)) +
          "); supported: float32, float64, complex64, bfloat16, float16");
  }
}

bool same_dims(ffi::AnyBuffer::Dimensions x, ffi::AnyBuffer::Dimensions y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != y[i]) return false;
  return true;
}

ffi::Error run(ffi::ThreadPool& pool, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
               const ffi::AnyBuffer& h0, ffi::AnyBuffer* h, ffi::AnyBuffer* a_prod, int64_t axis,
               bool reverse) {
  const std::string where = "jax_selscan linear_scan (CPU): ";
  DType dtype;
  if (ffi::Error e = to_dtype(a.element_type(), &dtype); e.failure()) return e;
  if (b.element_type() != a.element_type() || h0.element_type() != a.element_type() ||
      h->element_type() != a.element_type() ||
      (a_prod != nullptr && a_prod->element_type() != a.element_type()))
    return ffi::Error::InvalidArgument(where + "a, b, h0 and the results must share a dtype");
  const auto dims = a.dimensions();
  const int64_t rank = static_cast<int64_t>(dims.size());
  if (axis < 0 || axis >= rank)
    return ffi::Error::InvalidArgument(where + "axis " + std::to_string(axis) +
                                       " out of range for rank " + std::to_string(rank));
  if (!same_dims(b.dimensions(), dims) || !same_dims(h->dimensions(), dims) ||
      (a_prod != nullptr && !same_dims(a_prod->dimensions(), dims)))
    return ffi::Error::InvalidArgument(where + "a, b and the results must have the same shape");
  const auto h0_dims = h0.dimensions();
  bool h0_ok = static_cast<int64_t>(h0_dims.size()) == rank - 1;
  for (int64_t i = 0, k = 0; h0_ok && i < rank; ++i)
    if (i != axis) h0_ok = h0_dims[k++] == dims[i];
  if (!h0_ok) return ffi::Error::InvalidArgument(where + "h0 must have a's shape without `axis`");

  LinearScanArgs args;
  args.dtype = dtype;
  args.outer = 1;
  args.inner = 1;
  for (int64_t i = 0; i < axis; ++i) args.outer *= dims[i];
  for (int64_t i = axis + 1; i < rank; ++i) args.inner *= dims[i];
  args.length = dims[axis];
  args.a = a.untyped_data();
  args.b = b.untyped_data();
  args.h0 = h0.untyped_data();
  args.h = h->untyped_data();
  args.a_prod = a_prod != nullptr ? a_prod->untyped_data() : nullptr;
  args.reverse = reverse;
  if (args.outer == 0 || args.length == 0 || args.inner == 0) return ffi::Error::Success();

  std::string error;
  const KernelTable* kernels = select_kernel_table(&error);
  if (kernels == nullptr) return ffi::Error::InvalidArgument(where + error);
  PoolExecutor executor(pool);
  // (A buffer of 4 MiB holds far more than kMinParallelElements: the kernel runs threaded too.)
  prepare_output(args.h, h->size_bytes(), executor);
  if (args.a_prod != nullptr) prepare_output(args.a_prod, a_prod->size_bytes(), executor);
  try {
    linear_scan_cpu(args, *kernels, executor);
  } catch (const std::bad_alloc&) {
    return scratch_exhausted(where);
  }
  return ffi::Error::Success();
}

ffi::Error LinearScanImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                          ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer> h, int64_t axis,
                          bool reverse, int64_t /*algorithm*/) {
  return run(pool, a, b, h0, &*h, nullptr, axis, reverse);
}

ffi::Error LinearScanProdImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                              ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer> h,
                              ffi::Result<ffi::AnyBuffer> a_prod, int64_t axis, bool reverse,
                              int64_t /*algorithm*/) {
  return run(pool, a, b, h0, &*h, &*a_prod, axis, reverse);
}

}  // namespace
}  // namespace jax_selscan

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxSelscanLinearScan, jax_selscan::LinearScanImpl,
                              jss_ffi::with_ls_attrs(jss_ffi::bind_ls<ffi::ThreadPool, false>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxSelscanLinearScanProd, jax_selscan::LinearScanProdImpl,
                              jss_ffi::with_ls_attrs(jss_ffi::bind_ls<ffi::ThreadPool, true>()));

// selective_scan (selective_scan_ffi.cc)
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxSelscanSelectiveScan);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxSelscanSelectiveScanBwd);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxSelscanSelectiveScanCkpt);

NB_MODULE(_cpu, m) {
  m.doc() = "jax_selscan CPU kernels (XLA FFI handlers)";
  m.def("registrations", [] {
    nb::dict d;
    d["jax_selscan_linear_scan"] = nb::capsule(reinterpret_cast<void*>(JaxSelscanLinearScan));
    d["jax_selscan_linear_scan_prod"] =
        nb::capsule(reinterpret_cast<void*>(JaxSelscanLinearScanProd));
    d["jax_selscan_selective_scan"] = nb::capsule(reinterpret_cast<void*>(JaxSelscanSelectiveScan));
    d["jax_selscan_selective_scan_ckpt"] =
        nb::capsule(reinterpret_cast<void*>(JaxSelscanSelectiveScanCkpt));
    d["jax_selscan_selective_scan_bwd_cpu"] =
        nb::capsule(reinterpret_cast<void*>(JaxSelscanSelectiveScanBwd));
    return d;
  });
  m.def("isa", [] {
    std::string error;
    const jax_selscan::KernelTable* t = jax_selscan::select_kernel_table(&error);
    if (t == nullptr) throw std::runtime_error(error);
    return std::string(t->name);
  }, "The kernel ISA a call would use now (honours JAX_SELSCAN_CPU_ISA).");
  m.def("ss_lanes", [] {
    std::string error;
    const jax_selscan::SsTable* t = jax_selscan::select_ss_table(&error);
    return t == nullptr ? 0 : static_cast<int>(t->lanes);
  }, "Channels per task (= steps per checkpoint block) of the selective scan's ISA now; 0: none.");
  m.def("supported_isas", [] {
    nb::list l;
    for (const jax_selscan::KernelTable* t : jax_selscan::supported_kernel_tables())
      l.append(nb::str(t->name));
    return l;
  }, "Kernel ISAs this CPU runs, best first.");
}
