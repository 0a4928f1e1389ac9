// ShardedOptimizer: the gradient hand-off (NOTE [Gradient hand-off]) and the
// pipelined schedule (NOTE [Pipelined step]); the sequential schedule and the
// per-bucket work both share are in sharded_optimizer_step.cc.

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optimizer/sharded_optimizer.h"

namespace muonshard::worker {
namespace {

using internal::EntryRef;
using internal::PartLayout;
using internal::StepPipeline;

int64_t NanosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
}

double SecondsSince(std::chrono::steady_clock::time_point start) { return NanosSince(start) * 1e-9; }

double BusiestLane(const std::vector<int64_t>& nanos) {
  int64_t most = 0;
  for (int64_t n : nanos) most = std::max(most, n);
  return most * 1e-9;
}

template <typename Entries>
int LastTensor(const Entries& entries) {
  int last = -1;
  for (const v1::BucketEntry& e : entries) last = std::max(last, e.tensor());
  return last;
}

// The pipeline's events, per bucket key k of K: the bucket's gradients are
// all in (k), it is reduced (K + k), its update is done (2K + k).
int GradsIn(int key) { return key; }
int Reduced(int key, int keys) { return keys + key; }
int Updated(int key, int keys) { return 2 * keys + key; }
}  // namespace

absl::Status ShardedOptimizer::InitPipeline() {
  order_.assign(layout_.groups.size(), {});
  owned_in_muon_.assign(view_.muon_buckets_size(), {});
  std::vector<std::vector<std::pair<int, BucketKey>>> by_last(layout_.groups.size());
  for (int b = 0; b < view_.muon_buckets_size(); ++b) {
    by_last[layout_.muon_buckets[b].group].push_back({LastTensor(view_.muon_buckets(b).entries()), {true, b}});
  }
  for (int b = 0; b < view_.adamw_buckets_size(); ++b) {
    by_last[layout_.adamw_buckets[b].group].push_back({LastTensor(view_.adamw_buckets(b).entries()), {false, b}});
  }
  for (size_t g = 0; g < by_last.size(); ++g) {
    // Descending last tensor; the sort is stable, so ties keep Muon before
    // AdamW and ascending position: the same order on every rank.
    std::stable_sort(by_last[g].begin(), by_last[g].end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [last, key] : by_last[g]) order_[g].push_back(key);
  }
  for (size_t i = 0; i < layout_.owned.size(); ++i) {
    owned_in_muon_[layout_.owned[i].bucket].push_back(static_cast<int>(i));
  }
  OrderTpBuckets();
  // Decided by the backend, not by what this rank owns: every rank of a
  // group must run the same schedule (their collective orders differ).
  if (ResolveStepSchedule(step_options_.schedule, host_memory()) == StepSchedule::kSequential) {
    return absl::OkStatus();
  }
  if (!host_memory()) {
    return absl::InvalidArgumentError(
        "the pipelined step schedule needs a host-memory kernel backend (device backends run the sequential one, "
        "whose collectives are stream-ordered)");
  }
  lane_of_group_.assign(layout_.groups.size(), -1);
  int lanes = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].comm != nullptr && step_options_.phases != StepPhases::kComputeOnly) lane_of_group_[g] = lanes++;
  }
  pipeline_ = std::make_unique<StepPipeline>(lanes, [this](const absl::Status& reason) { AbortComms(reason); });
  return absl::OkStatus();
}

// NOTE [Pipelined step]: the Muon buckets that exchange TP shards, in one
// order on every rank of a TP group. The ranks of a TP group hold the same
// buckets (shards of the same tensors), so the hand-off order (descending
// last tensor, then position) is the same on each of them.
void ShardedOptimizer::OrderTpBuckets() {
  std::vector<std::pair<int, int>> by_last;
  for (int b = 0; b < view_.muon_buckets_size(); ++b) {
    if (!tp_batches_[b].empty()) by_last.push_back({-LastTensor(view_.muon_buckets(b).entries()), b});
  }
  std::sort(by_last.begin(), by_last.end());
  tp_order_.clear();
  for (const auto& [negated_last, bucket] : by_last) tp_order_.push_back(bucket);
}

void ShardedOptimizer::AbortComms(const absl::Status& reason) {
  for (GroupState& g : groups_) {
    if (g.comm != nullptr) g.comm->Abort(reason);
  }
}

absl::Status ShardedOptimizer::BeginStep() {
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  absl::Status s = ZeroBucketGaps();
  if (!s.ok()) return Broken(s);
  handed_.assign(layout_.parts.size(), false);
  entries_left_.assign(BucketCount(), 0);
  for (int b = 0; b < view_.muon_buckets_size(); ++b) entries_left_[b] = view_.muon_buckets(b).entries_size();
  for (int b = 0; b < view_.adamw_buckets_size(); ++b) {
    entries_left_[Key({false, b})] = view_.adamw_buckets(b).entries_size();
  }
  step_comm_before_ = CommSnapshot();
  step_start_ = std::chrono::steady_clock::now();
  tracing_ = step_options_.trace;
  if (tracing_) step_started_wall_ = absl::Now();
  {
    absl::MutexLock lock(&spans_mu_);
    spans_.clear();  // a failed step's
  }
  reduce_ns_.assign(pipeline_ == nullptr ? 0 : pipeline_->lanes(), 0);
  sync_ns_.assign(reduce_ns_.size(), 0);
  muon_seconds_ = 0;
  adamw_seconds_ = 0;
  in_step_ = true;
  if (pipeline_ == nullptr) return absl::OkStatus();
  pipeline_->Begin(3 * BucketCount());
  PostLaneOps();
  for (int k = 0; k < BucketCount(); ++k) {
    if (entries_left_[k] == 0) BucketGradientsIn(KeyBucket(k));
  }
  return absl::OkStatus();
}

void ShardedOptimizer::PostLaneOps() {
  const int keys = BucketCount();
  for (size_t g = 0; g < order_.size(); ++g) {
    const int lane = lane_of_group_[g];
    if (lane < 0) continue;
    for (const BucketKey& key : order_[g]) {
      pipeline_->Post(
          lane, GradsIn(Key(key)), [this, key] { return LaneCollective(key, true); }, Reduced(Key(key), keys),
          Updates(key));
    }
    // Non-owners of a Muon bucket receive its broadcast: nothing to wait for.
    for (const BucketKey& key : order_[g]) {
      pipeline_->Post(
          lane, Updates(key) ? Updated(Key(key), keys) : StepPipeline::kNoEvent,
          [this, key] { return LaneCollective(key, false); }, StepPipeline::kNoEvent, false);
    }
  }
}

absl::Status ShardedOptimizer::LaneCollective(const BucketKey& key, bool reduce) {
  const auto start = std::chrono::steady_clock::now();
  Communicator& comm = *groups_[GroupOf(key)].comm;
  const int lane = lane_of_group_[GroupOf(key)];
  absl::Status s = Traced(reduce ? StepSpan::Kind::kReduce : StepSpan::Kind::kSync, key, lane,
                          [&] { return reduce ? ReduceBucket(comm, key) : SyncBucket(comm, key); });
  (reduce ? reduce_ns_ : sync_ns_)[lane] += NanosSince(start);
  return s;
}

absl::Status ShardedOptimizer::Traced(StepSpan::Kind kind, const BucketKey& key, int lane,
                                      absl::FunctionRef<absl::Status()> work) {
  if (!tracing_) return work();
  const int64_t start = NanosSince(step_start_);
  absl::Status s = work();
  const StepSpan span{kind, key.muon, key.bucket, lane, start, NanosSince(step_start_)};
  absl::MutexLock lock(&spans_mu_);
  spans_.push_back(span);
  return s;
}

absl::Status ShardedOptimizer::CheckHandOff(int tensor, const PartLayout** part) const {
  if (!broken_.ok()) return broken_;
  if (!in_step_) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank(), ": no step open (call BeginStep first)"));
  }
  *part = FindPart(tensor);
  if (*part == nullptr) return absl::NotFoundError(absl::StrCat("rank ", rank(), " holds no part of tensor ", tensor));
  if (handed_[*part - layout_.parts.data()]) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", Spec(**part).name(), "\": gradient already handed over in this step"));
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::GradReady(int tensor, absl::Span<const float> grad) {
  const PartLayout* part = nullptr;
  MUONSHARD_RETURN_IF_ERROR(CheckHandOff(tensor, &part));
  MUONSHARD_RETURN_IF_ERROR(CheckGradientSize(*part, static_cast<int64_t>(grad.size()), true));
  absl::Status s = PackPart(*part, grad);
  if (!s.ok()) return Broken(s);
  PartHandedOver(*part);
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::GradReady(int tensor, const BackendGradient& grad) {
  const PartLayout* part = nullptr;
  MUONSHARD_RETURN_IF_ERROR(CheckHandOff(tensor, &part));
  MUONSHARD_RETURN_IF_ERROR(CheckGradientSize(*part, grad.numel, grad.data != nullptr));
  absl::Status s = PackBackendPart(*part, grad);
  if (!s.ok()) return Broken(s);
  PartHandedOver(*part);
  return absl::OkStatus();
}

void ShardedOptimizer::PartHandedOver(const PartLayout& part) {
  handed_[&part - layout_.parts.data()] = true;
  for (const EntryRef& ref : part.entries) {
    const BucketKey key{ref.muon, ref.bucket};
    if (--entries_left_[Key(key)] == 0) BucketGradientsIn(key);
  }
}

void ShardedOptimizer::BucketGradientsIn(const BucketKey& key) {
  if (pipeline_ == nullptr) return;  // sequential: FinishStep reduces
  if (lane_of_group_[GroupOf(key)] >= 0) {
    pipeline_->Set(GradsIn(Key(key)), false);
  } else {  // nothing to reduce (a group of one, or compute only)
    pipeline_->Set(Reduced(Key(key), BucketCount()), Updates(key));
  }
}

absl::StatusOr<StepStats> ShardedOptimizer::FinishStep() {
  if (!broken_.ok()) return broken_;
  if (!in_step_) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank(), ": no step open (call BeginStep first)"));
  }
  for (size_t p = 0; p < handed_.size(); ++p) {
    if (handed_[p]) continue;
    absl::Status missing =
        absl::FailedPreconditionError(absl::StrCat("rank ", rank(), ": tensor \"", Spec(layout_.parts[p]).name(),
                                                   "\" was not handed over (GradReady) in this step"));
    // Sequential: nothing was sent yet, the step stays open.
    return pipeline_ == nullptr ? missing : Broken(missing);
  }
  return pipeline_ == nullptr ? FinishSequential() : FinishPipelined();
}

absl::StatusOr<StepStats> ShardedOptimizer::FinishPipelined() {
  UpdateAsReduced();
  absl::Status s = pipeline_->Finish();
  in_step_ = false;
  if (!s.ok()) return Broken(s);
  if (step_options_.phases != StepPhases::kCommunicationOnly) AdvanceBetaPows();
  StepStats stats;
  stats.reduce_seconds = BusiestLane(reduce_ns_);
  stats.muon_seconds = muon_seconds_;
  stats.adamw_seconds = adamw_seconds_;
  stats.sync_seconds = BusiestLane(sync_ns_);
  return CloseStep(stats);
}

void ShardedOptimizer::UpdateAsReduced() {
  const int keys = BucketCount();
  int updates = 0;
  for (int k = 0; k < keys; ++k) updates += Updates(KeyBucket(k)) ? 1 : 0;
  TpTurns turns{std::vector<bool>(view_.muon_buckets_size(), false), 0};
  for (int done = 0; done < updates;) {
    absl::StatusOr<int> event = pipeline_->NextReady();
    if (!event.ok()) return;  // Finish() reports it
    const std::vector<BucketKey> now = InTurn(KeyBucket(*event - keys), &turns);
    absl::Status s = UpdateReduced(now);
    if (!s.ok()) {
      pipeline_->Fail(s);
      return;
    }
    done += static_cast<int>(now.size());
  }
}

// A bucket with TP exchanges waits for its turn in tp_order_; the others
// are updated as soon as they are reduced.
std::vector<ShardedOptimizer::BucketKey> ShardedOptimizer::InTurn(const BucketKey& reduced, TpTurns* turns) const {
  if (!reduced.muon || tp_batches_[reduced.bucket].empty()) return {reduced};
  turns->reduced[reduced.bucket] = true;
  std::vector<BucketKey> now;
  for (; turns->next < tp_order_.size() && turns->reduced[tp_order_[turns->next]]; ++turns->next) {
    now.push_back({true, tp_order_[turns->next]});
  }
  return now;
}

absl::Status ShardedOptimizer::UpdateReduced(absl::Span<const BucketKey> keys) {
  for (const BucketKey& key : keys) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = Traced(StepSpan::Kind::kUpdate, key, StepSpan::kCallerThread, [&] { return UpdateBucket(key); });
    (key.muon ? muon_seconds_ : adamw_seconds_) += SecondsSince(start);
    MUONSHARD_RETURN_IF_ERROR(s);
    pipeline_->Set(Updated(Key(key), BucketCount()), false);
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::UpdateBucket(const BucketKey& key) {
  if (step_options_.phases == StepPhases::kCommunicationOnly) return absl::OkStatus();
  return key.muon ? UpdateMuonBucket(key.bucket) : UpdateAdamwBucket(key.bucket);
}

StepStats ShardedOptimizer::CloseStep(StepStats stats) {
  stats.total_seconds = SecondsSince(step_start_);
  const StepCommBytes after = CommSnapshot();
  stats.comm.grad_reduce = after.grad_reduce - step_comm_before_.grad_reduce;
  stats.comm.grad_reduce_scatter = after.grad_reduce_scatter - step_comm_before_.grad_reduce_scatter;
  stats.comm.param_broadcast = after.param_broadcast - step_comm_before_.param_broadcast;
  stats.comm.param_all_gather = after.param_all_gather - step_comm_before_.param_all_gather;
  stats.comm.tp = after.tp - step_comm_before_.tp;
  stats.comm.collectives = after.collectives - step_comm_before_.collectives;
  if (tracing_) {
    tracing_ = false;
    stats.started = step_started_wall_;
    absl::MutexLock lock(&spans_mu_);
    stats.spans.swap(spans_);
    spans_.clear();
  }
  ++steps_;
  return stats;
}

ShardedOptimizer::BucketKey ShardedOptimizer::KeyBucket(int key) const {
  const int muon = view_.muon_buckets_size();
  return key < muon ? BucketKey{true, key} : BucketKey{false, key - muon};
}

bool ShardedOptimizer::Updates(const BucketKey& key) const {
  return !key.muon || layout_.muon_buckets[key.bucket].owned;
}

int ShardedOptimizer::GroupOf(const BucketKey& key) const {
  return key.muon ? layout_.muon_buckets[key.bucket].group : layout_.adamw_buckets[key.bucket].group;
}

}  // namespace muonshard::worker
