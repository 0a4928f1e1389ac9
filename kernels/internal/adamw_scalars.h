#ifndef MUONSHARD_KERNELS_INTERNAL_ADAMW_SCALARS_H_
#define MUONSHARD_KERNELS_INTERNAL_ADAMW_SCALARS_H_

#include "kernels/adamw.h"
#include "kernels/internal/elementwise_math.h"

namespace muonshard::kernels::internal {

// The per-call AdamW scalars for the current beta powers.
AdamWScalars MakeAdamWScalars(const AdamWOptions& options, float beta1_pow, float beta2_pow);

}  // namespace muonshard::kernels::internal

#endif  // MUONSHARD_KERNELS_INTERNAL_ADAMW_SCALARS_H_
