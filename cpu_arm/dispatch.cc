// Run-time ISA dispatch: which compiled kernel table this CPU can run.
//
// The kernels are compiled once per ISA (kernels_isa.cc); this file is built
// for the baseline target and only looks at CPU features. The environment
// variable JAX_SELSCAN_CPU_ISA (avx512 | avx2 | neon | generic; "scalar" is an
// alias of generic; empty or "auto" = best) forces one, e.g. for tests.
#include <cstdlib>
#include <string>
#include <vector>

#include "linear_scan_cpu.h"

namespace jax_selscan {
namespace {

bool cpu_has(const char* isa) {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const std::string s = isa;
  // The AVX-512 kernels also use AVX2/FMA/F16C instructions (VEX-encoded parts).
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (s == "avx2") return avx2;
  if (s == "avx512") return avx2 && __builtin_cpu_supports("avx512f");
  return false;
#elif defined(__aarch64__)
  return std::string(isa) == "neon";  // Advanced SIMD is mandatory on AArch64
#else
  (void)isa;
  return false;
#endif
}

// Every table compiled into this build that this CPU runs, best first. A table
// whose backend is not the one its name promises (the ISA flags did not reach
// the compiler) is skipped rather than trusted.
std::vector<const KernelTable*> compiled_tables() {
  std::vector<const KernelTable*> t;
  auto add = [&](const char* isa, const KernelTable* table) {
    if (cpu_has(isa) && std::string(table->name) == isa) t.push_back(table);
  };
#if defined(__x86_64__) || defined(_M_X64)
  add("avx512", kernel_table_avx512());
  add("avx2", kernel_table_avx2());
#endif
#if defined(__aarch64__)
  add("neon", kernel_table_neon());
#endif
  t.push_back(kernel_table_generic());
  return t;
}

}  // namespace

std::vector<const KernelTable*> supported_kernel_tables() {
  static const std::vector<const KernelTable*> tables = compiled_tables();
  return tables;
}

const KernelTable* kernel_table_named(const std::string& name) {
  const std::string n = name == "scalar" ? "generic" : name;
  for (const KernelTable* t : supported_kernel_tables())
    if (n == t->name) return t;
  return nullptr;
}

const KernelTable* select_kernel_table(std::string* error) {
  const char* env = std::getenv("JAX_SELSCAN_CPU_ISA");
  if (env == nullptr || env[0] == '\0' || std::string(env) == "auto")
    return supported_kernel_tables().front();
  const KernelTable* t = kernel_table_named(env);
  if (t == nullptr && error != nullptr) {
    std::string names;
    for (const KernelTable* s : supported_kernel_tables()) names += std::string(" ") + s->name;
    *error = "JAX_SELSCAN_CPU_ISA=" + std::string(env) +
             " is not available on this CPU/build; available:" + names + " (or auto)";
  }
  return t;
}

}  // namespace jax_selscan
