#ifndef MUONSHARD_KERNELS_BLAS_CORE_H_
#define MUONSHARD_KERNELS_BLAS_CORE_H_

// Which kernels OpenBLAS runs, and whether the CPU could run faster ones.
//
// OpenBLAS picks its kernels from the CPU's model (cpuid family and model)
// when it loads. A model it does not know -- many VMs report a generic one,
// "Intel(R) Xeon(R) Processor" -- gets the generic x86-64 kernels
// ("Prescott": SSE3) even on a CPU with AVX2 or AVX-512. On the 2-core
// development VM (2026-12-06, AVX-512) that made sgemm 47.8 GFLOP/s where
// OPENBLAS_CORETYPE=SkylakeX gives 304.1 and Haswell 126.5, and every CPU
// step's Newton-Schulz that much slower. OPENBLAS_CORETYPE, set before the
// process starts, overrides the choice; a running process cannot change it.

#include <string>

#include "absl/strings/string_view.h"

namespace muonshard::kernels {

// The vector units that decide which OpenBLAS kernels a CPU can run.
struct CpuVectorUnits {
  bool avx2_fma = false;  // AVX2 and FMA3
  bool avx512 = false;    // AVX-512 F, BW, VL, DQ and CD (OpenBLAS's SkylakeX set)
};

// This CPU's (cpuid).
CpuVectorUnits DetectCpuVectorUnits();

// The OpenBLAS core this process runs ("SkylakeX", "Haswell", "Prescott",
// ...; openblas_get_corename()).
std::string OpenBlasCore();

// The OpenBLAS core a CPU with `cpu` should run when OpenBLAS runs `core`
// without the units the CPU has: "SkylakeX" (AVX-512), "Haswell" (AVX2 +
// FMA); empty when `core` already uses them (or is not an x86 core name
// this knows).
std::string BetterOpenBlasCore(absl::string_view core, const CpuVectorUnits& cpu);

// One line for the logs when OpenBLAS runs slower kernels than the CPU
// could: "OpenBLAS runs its Prescott kernels on a CPU with AVX-512: start
// with OPENBLAS_CORETYPE=SkylakeX for several times faster matrix
// products". Empty when the choice is fine, and when `coretype_env` (the
// value of OPENBLAS_CORETYPE) is set: the user chose.
std::string BlasCoreAdvice(absl::string_view core, const CpuVectorUnits& cpu, absl::string_view coretype_env);
// The same for this process.
std::string BlasCoreAdvice();

}  // namespace muonshard::kernels

#endif  // MUONSHARD_KERNELS_BLAS_CORE_H_
