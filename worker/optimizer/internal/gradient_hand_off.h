#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_GRADIENT_HAND_OFF_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_GRADIENT_HAND_OFF_H_

// GradientHandOff: the bookkeeping of one step's gradient hand-off (NOTE
// [Gradient hand-off] in sharded_optimizer.h): which held parts were handed
// over, and which buckets have all their entries' gradients in, so their
// reduce may start. Pure: no buffers, no communicators.
//
// Thread-compatible. The layout must outlive it.

#include <vector>

#include "worker/optimizer/internal/optimizer_layout.h"

namespace muonshard::worker::internal {

class GradientHandOff {
 public:
  explicit GradientHandOff(const OptimizerLayout& layout) : layout_(layout) {}

  GradientHandOff(const GradientHandOff&) = delete;
  GradientHandOff& operator=(const GradientHandOff&) = delete;

  // Starts a step: no part handed over. Returns the buckets without entries,
  // whose gradients are all in already, by ascending key.
  std::vector<BucketKey> Begin();

  // Whether part `part` (position in the layout's parts) was handed over.
  bool handed(int part) const { return handed_[part]; }

  // Marks `part` handed over. Returns the buckets its gradient completed, in
  // the order of the part's entries. REQUIRES: not handed over yet.
  std::vector<BucketKey> HandOver(const PartLayout& part);

  // The first part not handed over (position in the layout's parts), -1
  // when every part was.
  int FirstMissing() const;

 private:
  const OptimizerLayout& layout_;
  std::vector<bool> handed_;       // per part
  std::vector<int> entries_left_;  // per bucket key: entries not handed over
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_GRADIENT_HAND_OFF_H_
