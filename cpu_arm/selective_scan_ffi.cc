// XLA FFI handler for selective_scan on CPU (registered by ffi_module.cc).
//
//   jax_selscan_selective_scan
//     args:  u, delta (batch, D, L); A (D, N); B, C ((D, N) or (batch, G, N, L));
//            D (D,); z (batch, D, L); delta_bias (D,); h0 (batch, D, N)
//            (absent optional arguments: any buffer, with has_* = false)
//     rets:  out (batch, D, L) in u's dtype;
//            last_fwd, last_rev: (batch, D, N) float32, or zero-size when not wanted
//     attrs: delta_softplus (bool), direction (int64: 0 forward, 1 reverse,
//            2 bidirectional), has_D, has_z, has_delta_bias, has_h0 (bool)
//   dtypes: float32, bfloat16, float16 for every array (mixed allowed); float32 state.
//
// Threads: XLA's intra-op pool (the calling thread plus at most
// num_threads - 1 pool tasks); JAX_SELSCAN_CPU_THREADS=k (read on every call)
// caps that at k (for scaling measurements; 0 or unset: no cap).
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>  // madvise
#endif

#include "selective_scan_cpu.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_selscan {
namespace {

// parallel_for on the XLA pool: helpers and the caller claim items from a
// shared counter; the caller waits only for claimed items (never for a pool
// task that has not started). Shared state is reference-counted so a helper
// that starts late finds nothing to do and touches nothing else.
class SsPoolExecutor final : public Executor {
 public:
  explicit SsPoolExecutor(ffi::ThreadPool& pool) : pool_(pool), threads_(pool.num_threads()) {
    if (const char* env = std::getenv("JAX_SELSCAN_CPU_THREADS"); env != nullptr && env[0] != '\0') {
      const int64_t cap = std::strtoll(env, nullptr, 10);
      if (cap > 0 && cap < threads_) threads_ = cap;
    }
  }
  int64_t num_threads() const override { return threads_ > 0 ? threads_ : 1; }
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) override {
    if (n <= 1 || threads_ <= 1) {
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    struct Shared {
      const std::function<void(int64_t)>* fn;
      int64_t n;
      std::atomic<int64_t> next{0}, left;
      std::mutex mu;
      std::condition_variable cv;
    };
    auto s = std::make_shared<Shared>();
    s->fn = &fn;
    s->n = n;
    s->left.store(n);
    auto drain = [](Shared& sh) {
      for (int64_t i; (i = sh.next.fetch_add(1)) < sh.n;) {
        (*sh.fn)(i);
        if (sh.left.fetch_sub(1) == 1) {
          std::lock_guard<std::mutex> lock(sh.mu);
          sh.cv.notify_all();
        }
      }
    };
    for (int64_t k = 1; k < std::min<int64_t>(threads_, n); ++k) pool_.Schedule([s, drain] { drain(*s); });
    drain(*s);
    std::unique_lock<std::mutex> lock(s->mu);
    s->cv.wait(lock, [&] { return s->left.load() == 0; });
  }

 private:
  ffi::ThreadPool& pool_;
  int64_t threads_;
};

// The output is a fresh XLA buffer on most calls: first-touch page faults cost a
// large part of a memory-bound call on a VM (see the linear scan's round 5 in
// docs/PERFORMANCE_CPU.md). Ask for transparent huge pages on its 2 MiB-aligned
// interior (effective where THP is "madvise"; advisory only, results unchanged).
void advise_huge_pages_out(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (bytes < 2 * kHuge) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

bool ss_type(ffi::DataType t, SsType* out) {
  switch (t) {
    case ffi::F32: *out = SsType::kF32; return true;
    case ffi::BF16: *out = SsType::kBF16; return true;
    case ffi::F16: *out = SsType::kF16; return true;
    default: return false;
  }
}

int64_t numel(const ffi::AnyBuffer& x) {
  int64_t n = 1;
  for (int64_t d : x.dimensions()) n *= d;
  return n;
}

bool dims_are(const ffi::AnyBuffer& x, std::initializer_list<int64_t> want) {
  auto d = x.dimensions();
  if (d.size() != want.size()) return false;
  size_t i = 0;
  for (int64_t w : want)
    if (d[i++] != w) return false;
  return true;
}

ffi::Error SelectiveScanImpl(ffi::ThreadPool pool, ffi::AnyBuffer u, ffi::AnyBuffer delta,
                             ffi::AnyBuffer A, ffi::AnyBuffer B, ffi::AnyBuffer C,
                             ffi::AnyBuffer D, ffi::AnyBuffer z, ffi::AnyBuffer delta_bias,
                             ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::AnyBuffer> last_fwd,
                             ffi::Result<ffi::AnyBuffer> last_rev, bool delta_softplus,
                             int64_t direction, bool has_D, bool has_z, bool has_delta_bias,
                             bool has_h0) {
  const std::string where = "jax_selscan selective_scan (CPU): ";
  auto bad = [&](const std::string& m) { return ffi::Error::InvalidArgument(where + m); };
  if (u.dimensions().size() != 3) return bad("u must be (batch, D, L)");
  const int64_t batch = u.dimensions()[0], dim = u.dimensions()[1], length = u.dimensions()[2];
  if (A.dimensions().size() != 2 || A.dimensions()[0] != dim) return bad("A must be (D, N)");
  const int64_t dstate = A.dimensions()[1];
  if (direction < 0 || direction > 2) return bad("direction must be 0, 1 or 2");

  SsParams p{};
  struct In { const ffi::AnyBuffer* buf; bool present; const void** ptr; SsType* type; const char* name; };
  In ins[] = {{&u, true, &p.u, &p.u_t, "u"},
              {&delta, true, &p.delta, &p.delta_t, "delta"},
              {&A, true, &p.A, &p.A_t, "A"},
              {&B, true, &p.B, &p.B_t, "B"},
              {&C, true, &p.C, &p.C_t, "C"},
              {&D, has_D, &p.D, &p.D_t, "D"},
              {&z, has_z, &p.z, &p.z_t, "z"},
              {&delta_bias, has_delta_bias, &p.delta_bias, &p.delta_bias_t, "delta_bias"},
              {&h0, has_h0, &p.h0, &p.h0_t, "h0"}};
  for (In& in : ins) {
    *in.type = SsType::kF32;
    *in.ptr = nullptr;
    if (!in.present) continue;
    if (!ss_type(in.buf->element_type(), in.type))
      return bad(std::string(in.name) + ": unsupported dtype (float32, bfloat16, float16)");
    *in.ptr = in.buf->untyped_data();
  }
  if (!ss_type(out->element_type(), &p.out_t)) return bad("out: unsupported dtype");
  if (!dims_are(delta, {batch, dim, length})) return bad("delta must have u's shape");
  if (has_z && !dims_are(z, {batch, dim, length})) return bad("z must have u's shape");
  if (has_D && !dims_are(D, {dim})) return bad("D must be (D,)");
  if (has_delta_bias && !dims_are(delta_bias, {dim})) return bad("delta_bias must be (D,)");
  if (has_h0 && !dims_are(h0, {batch, dim, dstate})) return bad("h0 must be (batch, D, N)");
  if (!dims_are(*out, {batch, dim, length})) return bad("out must have u's shape");
  auto bc = [&](const ffi::AnyBuffer& x, bool* var, int64_t* groups, const char* name) -> std::string {
    *groups = 1;
    auto d = x.dimensions();
    if (d.size() == 2 && d[0] == dim && d[1] == dstate) { *var = false; return ""; }
    if (d.size() == 4 && d[0] == batch && d[2] == dstate && d[3] == length && d[1] > 0 &&
        dim % d[1] == 0) {
      *var = true;
      *groups = d[1];
      return "";
    }
    return std::string(name) + " must be (D, N) or (batch, G, N, L) with G dividing D";
  };
  p.b_var = false;
  p.c_var = false;
  if (std::string e = bc(B, &p.b_var, &p.b_groups, "B"); !e.empty()) return bad(e);
  if (std::string e = bc(C, &p.c_var, &p.c_groups, "C"); !e.empty()) return bad(e);
  p.delta_softplus = delta_softplus;
  p.direction = static_cast<SsDirection>(direction);
  p.batch = batch;
  p.dim = dim;
  p.dstate = dstate;
  p.length = length;
  p.out = out->untyped_data();
  p.last_fwd = nullptr;
  p.last_rev = nullptr;
  for (auto [res, dst] : {std::pair{&*last_fwd, &p.last_fwd}, std::pair{&*last_rev, &p.last_rev}}) {
    if (numel(*res) == 0) continue;
    if (res->element_type() != ffi::F32 || !dims_are(*res, {batch, dim, dstate}))
      return bad("last states must be float32 (batch, D, N) or zero-size");
    *dst = static_cast<float*>(res->untyped_data());
  }
  std::string error;
  const SsTable* table = select_ss_table(&error);
  if (table == nullptr) return bad(error);
  advise_huge_pages_out(p.out, out->size_bytes());
  SsPoolExecutor executor(pool);
  selective_scan_cpu(p, *table, executor);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_selscan

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxSelscanSelectiveScan, jax_selscan::SelectiveScanImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // u
                                  .Arg<ffi::AnyBuffer>()  // delta
                                  .Arg<ffi::AnyBuffer>()  // A
                                  .Arg<ffi::AnyBuffer>()  // B
                                  .Arg<ffi::AnyBuffer>()  // C
                                  .Arg<ffi::AnyBuffer>()  // D
                                  .Arg<ffi::AnyBuffer>()  // z
                                  .Arg<ffi::AnyBuffer>()  // delta_bias
                                  .Arg<ffi::AnyBuffer>()  // h0
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>()  // last_fwd
                                  .Ret<ffi::AnyBuffer>()  // last_rev
                                  .Attr<bool>("delta_softplus")
                                  .Attr<int64_t>("direction")
                                  .Attr<bool>("has_D")
                                  .Attr<bool>("has_z")
                                  .Attr<bool>("has_delta_bias")
                                  .Attr<bool>("has_h0"));
