#include "kernels/blas_core.h"

#include <cblas.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace muonshard::kernels {
namespace {

// What an OpenBLAS x86-64 core's kernels use: 2 AVX-512, 1 AVX2 + FMA, 0
// neither, -1 a name this does not know (other architectures, new cores).
int CoreLevel(absl::string_view core) {
  const std::string c = absl::AsciiStrToLower(core);
  for (const char* name : {"skylakex", "cooperlake", "sapphirerapids"}) {
    if (c == name) return 2;
  }
  for (const char* name : {"haswell", "zen", "excavator", "steamroller"}) {
    if (c == name) return 1;
  }
  for (const char* name : {"prescott", "core2", "penryn", "dunnington", "nehalem", "sandybridge", "atom", "barcelona",
                           "bobcat", "bulldozer", "piledriver", "opteron", "opteron_sse3", "katmai", "coppermine",
                           "northwood", "banias", "athlon", "nano"}) {
    if (c == name) return 0;
  }
  return -1;
}

}  // namespace

CpuVectorUnits DetectCpuVectorUnits() {
  CpuVectorUnits cpu;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  cpu.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512cd");
#endif
  return cpu;
}

std::string OpenBlasCore() {
  const char* name = openblas_get_corename();
  return name != nullptr ? std::string(name) : std::string();
}

std::string BetterOpenBlasCore(absl::string_view core, const CpuVectorUnits& cpu) {
  const int level = CoreLevel(core);
  if (level < 0) return "";
  if (cpu.avx512 && level < 2) return "SkylakeX";
  if (cpu.avx2_fma && level < 1) return "Haswell";
  return "";
}

std::string BlasCoreAdvice(absl::string_view core, const CpuVectorUnits& cpu, absl::string_view coretype_env) {
  if (!coretype_env.empty()) return "";
  const std::string better = BetterOpenBlasCore(core, cpu);
  if (better.empty()) return "";
  return absl::StrCat("OpenBLAS runs its ", core, " kernels on a CPU with ", cpu.avx512 ? "AVX-512" : "AVX2",
                      ": start with OPENBLAS_CORETYPE=", better, " for several times faster matrix products");
}

std::string BlasCoreAdvice() {
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  return BlasCoreAdvice(OpenBlasCore(), DetectCpuVectorUnits(), env != nullptr ? env : "");
}

}  // namespace muonshard::kernels
