// StepScheduler: the pipelined schedule (NOTE [Pipelined step] in
// sharded_optimizer.h); the open step and the sequential schedule are in
// step_scheduler.cc.

#include <algorithm>
#include <utility>

#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "worker/optimizer/internal/step_scheduler.h"

namespace muonshard::worker::internal {
namespace {

// The pipeline's events, per bucket key k of K: the bucket's gradients are
// all in (k), it is reduced (K + k), its update is done (2K + k).
int GradsIn(int key) { return key; }
int Reduced(int key, int keys) { return keys + key; }
int Updated(int key, int keys) { return 2 * keys + key; }

}  // namespace

std::vector<BucketKey> StepScheduler::HandOffOrder(absl::FunctionRef<bool(const BucketKey&)> keep) const {
  std::vector<std::pair<int, BucketKey>> by_last;
  for (int k = 0; k < layout_.BucketCount(); ++k) {
    const BucketKey key = layout_.KeyBucket(k);
    if (keep(key)) by_last.push_back({layout_.LastTensor(key), key});
  }
  // Descending last tensor; the sort is stable, so ties keep Muon before
  // AdamW and ascending position: the same order on every rank.
  std::stable_sort(by_last.begin(), by_last.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<BucketKey> order;
  order.reserve(by_last.size());
  for (const auto& [last, key] : by_last) order.push_back(key);
  return order;
}

absl::Status StepScheduler::InitPipeline() {
  const std::vector<GroupLayout>& groups = layout_.index().groups;
  order_.clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    order_.push_back(HandOffOrder([&](const BucketKey& key) { return layout_.GroupOf(key) == static_cast<int>(g); }));
  }
  // Decided by the backend, not by what this rank owns: every rank of a
  // group must run the same schedule (their collective orders differ).
  const bool host_memory = backend_.device_kind() == kernels::DeviceKind::kCpu;
  if (ResolveStepSchedule(options_.schedule, host_memory) == StepSchedule::kSequential) {
    return absl::OkStatus();
  }
  if (!host_memory) return InitStreamed();
  lane_of_group_.assign(groups.size(), -1);
  int lanes = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (comms_.comm(static_cast<int>(g)) != nullptr && options_.phases != StepPhases::kComputeOnly) {
      lane_of_group_[g] = lanes++;
    }
  }
  pipeline_ = std::make_unique<StepPipeline>(lanes, [this](const absl::Status& reason) { comms_.AbortAll(reason); });
  return absl::OkStatus();
}

void StepScheduler::PostLaneOps() {
  const int keys = layout_.BucketCount();
  const auto nothing = [] { return absl::OkStatus(); };
  for (size_t g = 0; g < order_.size(); ++g) {
    const int lane = lane_of_group_[g];
    if (lane < 0) continue;
    // A scatter round's collective at its last bucket in the order; the
    // lane runs in order, so every bucket of the round is in by then, and
    // its other buckets are marked reduced once it is done.
    const std::vector<int> at = layout_.RoundCollectives(order_[g]);
    for (size_t i = 0; i < order_[g].size(); ++i) {
      const BucketKey key = order_[g][i];
      const int round = at[i];
      const int gate = GradsIn(layout_.Key(key));
      if (round == kNoCollective) {
        pipeline_->Post(lane, gate, nothing, StepPipeline::kNoEvent, false);
        continue;
      }
      pipeline_->Post(
          lane, gate, [this, key, round] { return LaneCollective(key, round, true); }, Reduced(layout_.Key(key), keys),
          layout_.Updates(key));
    }
    // Non-owners of a Muon bucket receive its broadcast: nothing to wait for.
    // A round's all-gather waits, in order, for this rank's bucket of it.
    for (size_t i = 0; i < order_[g].size(); ++i) {
      const BucketKey key = order_[g][i];
      const int round = at[i];
      const int gate = layout_.Updates(key) ? Updated(layout_.Key(key), keys) : StepPipeline::kNoEvent;
      if (round == kNoCollective) {
        pipeline_->Post(lane, gate, nothing, StepPipeline::kNoEvent, false);
        continue;
      }
      pipeline_->Post(
          lane, gate, [this, key, round] { return LaneCollective(key, round, false); }, StepPipeline::kNoEvent, false);
    }
  }
}

absl::Status StepScheduler::LaneCollective(const BucketKey& key, int round, bool reduce) {
  const int group = layout_.GroupOf(key);
  Communicator& comm = *comms_.comm(group);
  MUONSHARD_RETURN_IF_ERROR(
      recorder_.TimedLane(reduce, key, lane_of_group_[group], [&] { return Collective(comm, key, round, reduce); }));
  if (reduce &&
      round != kBucketCollective) {  // the round's other buckets are reduced too (`key`'s event is the Post's)
    for (int b : layout_.scatter_rounds()[round].buckets) {
      const BucketKey other{true, b};
      if (other == key) continue;
      pipeline_->Set(Reduced(layout_.Key(other), layout_.BucketCount()), layout_.Updates(other));
    }
  }
  return absl::OkStatus();
}

void StepScheduler::BucketGradientsIn(const BucketKey& key) {
  if (streamed_) {
    grads_in_[layout_.Key(key)] = true;
    IssueReduces();
    return;
  }
  if (pipeline_ == nullptr) return;  // sequential: Finish reduces
  if (lane_of_group_[layout_.GroupOf(key)] >= 0) {
    pipeline_->Set(GradsIn(layout_.Key(key)), false);
  } else {  // nothing to reduce (a group of one, or compute only)
    pipeline_->Set(Reduced(layout_.Key(key), layout_.BucketCount()), layout_.Updates(key));
  }
}

absl::StatusOr<StepStats> StepScheduler::FinishPipelined() {
  UpdateAsReduced();
  absl::Status s = pipeline_->Finish();
  in_step_ = false;
  MUONSHARD_RETURN_IF_ERROR(s);
  if (options_.phases != StepPhases::kCommunicationOnly) updater_.AdvanceBetaPows();
  return recorder_.Close(recorder_.BusyTimes(), comms_.Snapshot());
}

void StepScheduler::UpdateAsReduced() {
  const int keys = layout_.BucketCount();
  int updates = 0;
  for (int k = 0; k < keys; ++k) updates += layout_.Updates(layout_.KeyBucket(k)) ? 1 : 0;
  TpTurns turns{std::vector<bool>(layout_.view().muon_buckets_size(), false), 0};
  for (int done = 0; done < updates;) {
    absl::StatusOr<int> event = pipeline_->NextReady();
    if (!event.ok()) return;  // Finish() reports it
    const std::vector<BucketKey> now = InTurn(layout_.KeyBucket(*event - keys), &turns);
    absl::Status s = UpdateReduced(now);
    if (!s.ok()) {
      pipeline_->Fail(s);
      return;
    }
    done += static_cast<int>(now.size());
  }
}

// A bucket with TP exchanges waits until its round and every round before
// it in tp.rounds() are reduced, then the round is updated, its buckets in
// order (NOTE [TP exchange rounds]); the others are updated as soon as they
// are reduced.
std::vector<BucketKey> StepScheduler::InTurn(const BucketKey& reduced, TpTurns* turns) const {
  if (!reduced.muon || !tp_.Exchanges(reduced.bucket)) return {reduced};
  turns->reduced[reduced.bucket] = true;
  const std::vector<std::vector<int>>& rounds = tp_.rounds();
  std::vector<BucketKey> now;
  for (; turns->next < rounds.size(); ++turns->next) {
    const std::vector<int>& round = rounds[turns->next];
    if (!std::all_of(round.begin(), round.end(), [&](int b) { return turns->reduced[b]; })) break;
    for (int b : round) now.push_back({true, b});
  }
  return now;
}

absl::Status StepScheduler::UpdateReduced(const std::vector<BucketKey>& keys) {
  for (const BucketKey& key : keys) {
    MUONSHARD_RETURN_IF_ERROR(recorder_.TimedUpdate(key, [&] {
      if (options_.phases == StepPhases::kCommunicationOnly) return absl::OkStatus();
      return updater_.Update(key);
    }));
    pipeline_->Set(Updated(layout_.Key(key), layout_.BucketCount()), false);
  }
  return absl::OkStatus();
}

}  // namespace muonshard::worker::internal
