#include "worker/optimizer/internal/gradient_hand_off.h"

namespace muonshard::worker::internal {

std::vector<BucketKey> GradientHandOff::Begin() {
  const v1::RankView& view = layout_.view();
  handed_.assign(layout_.index().parts.size(), false);
  entries_left_.assign(layout_.BucketCount(), 0);
  for (int b = 0; b < view.muon_buckets_size(); ++b) entries_left_[b] = view.muon_buckets(b).entries_size();
  for (int b = 0; b < view.adamw_buckets_size(); ++b) {
    entries_left_[layout_.Key({false, b})] = view.adamw_buckets(b).entries_size();
  }
  std::vector<BucketKey> empty;
  for (int k = 0; k < layout_.BucketCount(); ++k) {
    if (entries_left_[k] == 0) empty.push_back(layout_.KeyBucket(k));
  }
  return empty;
}

std::vector<BucketKey> GradientHandOff::HandOver(const PartLayout& part) {
  handed_[layout_.PartIndex(part)] = true;
  std::vector<BucketKey> complete;
  for (const EntryRef& ref : part.entries) {
    const BucketKey key{ref.muon, ref.bucket};
    if (--entries_left_[layout_.Key(key)] == 0) complete.push_back(key);
  }
  return complete;
}

int GradientHandOff::FirstMissing() const {
  for (size_t p = 0; p < handed_.size(); ++p) {
    if (!handed_[p]) return static_cast<int>(p);
  }
  return -1;
}

}  // namespace muonshard::worker::internal
