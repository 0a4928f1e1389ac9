#ifndef MUONSHARD_WORKER_OPTIMIZER_SHARDED_OPTIMIZER_H_
#define MUONSHARD_WORKER_OPTIMIZER_SHARDED_OPTIMIZER_H_

// ShardedOptimizer: one rank's part of the sharded Muon + AdamW step, executed
// exactly as its plan view (v1::RankView) lays it out — Paddle's
// MuonShardingOptimizer ("Sharding Stage1 V3", docs/reference/paddle_internals.md §2b) as a
// library. A training program creates one per rank, sets the initial
// parameters, and calls Step() with its local gradients every iteration.
//
// Memory (all of it in the kernel backend's space: host memory for the CPU
// backend, device memory for CUDA; see "Device" below):
//   * Model copy: every tensor part in the rank's groups, in the tensor's
//     dtype (BF16/FP16 as 16-bit words, FP32 as float), stored — as Paddle's
//     parameters are views of param_storage — inside the parameter buffer of
//     the bucket that holds it. Every rank of a group holds every bucket of
//     the group, padding included.
//   * Gradient buffers: one per bucket in the plan's gradient dtype
//     (policy.grad_dtype, FP32 unless set), laid out exactly as the bucket.
//   * Optimizer state, only for what the rank owns: fp32 master + momentum of
//     each owned Muon shard; fp32 master + two moments of its shard of every
//     AdamW bucket (padding included), i.e. RankPlan.optimizer_state_bytes.
//     Only BF16/FP16 parameters have masters of their own: an FP32
//     parameter's is its model copy (NOTE [FP32 masters]).
//
// One Step():
//   1. Reduce. Each local gradient is packed into its bucket entries; every
//      Muon bucket is reduced (mean) to its owner and every AdamW bucket
//      reduce-scattered (mean) with the plan's (possibly uneven) shard
//      offsets. A group's collectives run inside one GroupStart/GroupEnd;
//      groups go in ascending id on every rank (NOTE [Collective ordering] in
//      communicator.h).
//   2. Muon on each owned shard (a whole 2-D matrix, or a range of matrices
//      of a 3-D expert stack, each matrix orthogonalised and scaled on its
//      own) with KernelBackend::MuonUpdate.
//   3. AdamW on the rank's shard of each AdamW bucket with
//      KernelBackend::AdamW.
//   4. Sync. Masters are cast into the model copy (fp32 ones are the model
//      copy already: NOTE [FP32 masters]); each Muon bucket's
//      parameters are broadcast from its owner and each AdamW bucket's
//      parameters all-gathered. A bucket holds one dtype, so each broadcast
//      moves exactly one dtype: the fix of Paddle #79286, where the seed packs
//      an owner's parameters of mixed dtypes into one buffer of the first
//      parameter's dtype and corrupts the rest.
//   Groups of one rank communicate nothing (the plan counts 0 bytes).
//
// NOTE [Beta powers]
// Paddle keeps a (β1^t, β2^t) pair per AdamW parameter. Every parameter is
// stepped every step, so all pairs are equal; the optimizer keeps one pair
// for all its AdamW shards and advances it once per step. The two scalars
// are not part of optimizer_state_bytes (the plan does not count them).
//
// Numerics: with the same kernels, an InProcess communicator (which sums in
// rank order, then divides) and the same gradients, every master and model
// copy is bit-identical to ReferenceOptimizer's; other backends differ by
// their fp32 summation order only.
//
// Device: every buffer lives in the kernel backend's memory, and the
// communicators receive pointers into it, so they must work in the same
// space: host-memory communicators (InProcess, Gloo) with the CPU backend,
// NCCL on the backend's GPU with the CUDA backend. Host values cross only in
// SetParameter, the gradients' packing (GradientSource hands host spans;
// a BackendGradientSource hands memory of the backend's own space, device
// pointers on CUDA, converted into the buckets there without a host trip),
// ReadModelCopy/GatherMasters and the checkpoint shards. Kernels run on the
// backend's stream and collectives on the communicators' streams; the
// optimizer synchronises the backend before each round of collectives and
// the communicators after it, so no stream reads a buffer another is still
// writing.
//
// Collective calls: Step() and GatherMasters() are collectives over every
// group of the rank: all ranks must call them in the same order. A rank that
// returns early (bad gradients) leaves its peers to fail on the
// communicators' timeouts.
//
// NOTE [Pipelined step]
// The order above is what a step computes, not when. With the pipelined
// schedule (StepOptions; the default on host-memory backends) every
// communicator gets a lane thread that runs the group's collectives in one
// fixed order on every rank (NOTE [Collective ordering]): first each
// bucket's Reduce / ReduceScatter, in hand-off order (descending last tensor
// index: the order in which backward produces gradients), each starting as
// soon as the bucket's gradients are in (NOTE [Gradient hand-off]); then each
// bucket's Broadcast / AllGather in the same order, each starting once the
// bucket's update is done (the owner's Muon, everyone's AdamW). The caller's
// thread meanwhile takes the reduced buckets in the order they complete and
// runs their Muon / AdamW. So Newton-Schulz of the first buckets overlaps the
// reduces of later ones, and their broadcasts overlap the Newton-Schulz of
// the rest; groups run side by side. Each bucket sees exactly the
// collectives and kernels of the sequential step, so the results are
// bit-identical to it (tests/worker/sharded_optimizer_pipeline_test.cc). The
// first error of any lane or of the compute cancels the step and aborts the
// rank's communicators (NOTE [Abort]), so no lane waits out its timeout.
// StepStats holds busy times (reduce/sync: time in those collectives,
// of the busiest lane; muon/adamw: compute), which overlap: each is at most
// total_seconds, their sum may exceed it. Device backends run the sequential schedule, whose
// collectives are stream-ordered already.
// The unit of overlap is the bucket, and a Muon bucket may be cut into
// pieces for it (NOTE [Step pieces] in internal/bucket_split.h): the
// optimizer runs its view with the pieces as buckets, on both schedules.
// With tp > 1 a bucket whose matrices are TP-split exchanges their shards
// over the TP group while it is updated (NOTE [Tensor-parallel Muon]). The
// updating thread takes those buckets in one order on every rank of the TP
// group, the hand-off order (tp_order_): one reduced out of turn waits until
// the buckets before it are updated, while other buckets are updated as they
// come. Nothing waits in a cycle: reduces wait for gradients only, and every
// rank of the TP group takes the same buckets in the same order.
//
// NOTE [Tensor-parallel Muon]
// With tp > 1 a TP-split Muon matrix is held as one shard per TP rank
// (HeldTensor numel and the parameters and gradients a program hands over
// are the shard's: the t-th block along the split dimension, row-major),
// and each of its owners (one per TP rank, one replica) keeps the master
// and momentum of its shard. Newton-Schulz must see the whole matrix
// (blockwise NS would be another optimizer), so per matrix, in the plan's
// owned order on every rank of the TP group:
//   momentum on each shard (KernelBackend::MuonMomentum);
//   GATHER_SCATTER: the NS inputs gathered to the plan's ns_tp_rank, which
//     assembles the whole matrix, orthogonalises it and scatters the
//     shards of the result back;
//   ALL_GATHER (`duplicated`): every TP rank all-gathers, assembles and
//     orthogonalises, keeping its own shard;
//   the apply on each shard with the whole matrix's scale (MuonApply).
// Element for element this is MuonUpdate on the whole matrix, so with the
// same reductions the masters are bit-identical to the unsharded
// reference's shards. Batched per bucket: one Gather per NS rank (and one
// AllGather) carries every matrix of the bucket's TP shards, each rank
// then orthogonalises the matrices it was given (batched per shard, so a
// stack's experts go through one call), and one Scatter per NS rank
// returns them: 2 x tp collectives per bucket, not per matrix. These
// collectives run in the Muon phase, on the updating thread, bucket after
// bucket in one order on every rank of the TP group: ascending bucket in the
// sequential schedule; in the pipelined one the hand-off order, each such
// bucket waiting until the ones before it are done (NOTE [Pipelined step]).
//
// NOTE [Gradient hand-off]
// Step(grads) takes every gradient at once. A trainer can instead hand them
// over as backward produces them, so the reduction of the last layers'
// buckets overlaps the backward of the first (Paddle #79428's backward
// hooks, DDP's buckets): BeginStep(), then GradReady(tensor, grad) once for
// every held tensor in any order, then FinishStep(), which returns what
// Step() returns. A bucket's reduce starts when its last tensor was handed
// over; in the hand-off order above the last layers come first. GradReady
// copies the gradient into its bucket (nothing to copy for a part's own
// slot, NOTE [Part storage]) and returns; the source may be reused at once.
// All ranks must hand over every tensor in each step. A bad gradient
// (INVALID_ARGUMENT) changes nothing and may be handed again; FinishStep
// with a tensor never handed fails: FAILED_PRECONDITION, and with the
// pipelined schedule the optimizer is broken (buckets were already on the
// wire).
//
// Thread-compatible: one thread at a time (the lane threads are internal).
// *backend and the communicators must outlive the optimizer.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "checkpoint/state.h"
#include "kernels/kernel_backend.h"
#include "muonshard/v1/plan.pb.h"
#include "worker/comm/communicator.h"
#include "worker/comm/counting_communicator.h"
#include "worker/optimizer/gradient_source.h"
#include "worker/optimizer/internal/backend_buffer.h"
#include "worker/optimizer/internal/step_pipeline.h"
#include "worker/optimizer/internal/view_layout.h"
#include "worker/optimizer/optimizer_config.h"
#include "worker/optimizer/step_stats.h"

namespace muonshard::worker {

class ShardedOptimizer {
 public:
  // The communicator of every group the rank is in, by plan group id
  // (CommGroup.id), each with the group's size and this rank's group rank.
  // A group of one rank may be left out.
  using CommGroups = absl::flat_hash_map<int, Communicator*>;

  // Validates `view` against itself and `comms` and allocates every buffer
  // (parameters zero until SetParameter). The optimizer keeps a copy of the
  // view.
  // Possible errors: INVALID_ARGUMENT (a view that does not hold together,
  // naming the bucket/tensor/field; a missing, extra or mis-sized
  // communicator; a bad config), the backend's allocation errors
  // (RESOURCE_EXHAUSTED, INTERNAL).
  static absl::StatusOr<std::unique_ptr<ShardedOptimizer>> Create(const v1::RankView& view, const CommGroups& comms,
                                                                  kernels::KernelBackend* backend,
                                                                  const OptimizerConfig& config,
                                                                  const StepOptions& step = {});

  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;
  ~ShardedOptimizer();

  int rank() const { return layout_.rank; }
  // The view the steps run: the one given to Create, with its Muon buckets
  // in pieces (StepOptions::muon_piece_bytes).
  const v1::RankView& view() const { return view_; }
  // The tensor parts this rank holds, by ascending plan index.
  const std::vector<HeldTensor>& held_tensors() const { return held_; }

  // Sets the value of the rank's part of `tensor` (HeldTensor::numel() fp32
  // values): the model copy becomes dtype(values) and the masters this rank
  // owns of it float(dtype(values)), as Paddle creates masters from the
  // low-precision parameter. Every rank of the group must set the same
  // values. Optimizer state (momentum, moments) is left as is. Every held
  // tensor must be set before the first Step().
  // Possible errors: NOT_FOUND (tensor not held), INVALID_ARGUMENT (size),
  // FAILED_PRECONDITION (broken by an earlier failed step).
  absl::Status SetParameter(int tensor, absl::Span<const float> values);

  // One optimizer step with this rank's local gradients (see above).
  // Possible errors: FAILED_PRECONDITION (a parameter never set, or the
  // optimizer is broken), INVALID_ARGUMENT (a gradient of the wrong size;
  // nothing has changed), whatever `grads` returns (nothing has changed),
  // and the communicators' and kernels' codes (ABORTED, DEADLINE_EXCEEDED,
  // INTERNAL, ...). After an error past the gradient checks the state is
  // partly updated: the optimizer is broken and every later call returns
  // FAILED_PRECONDITION (restore from a checkpoint into a new one).
  absl::StatusOr<StepStats> Step(GradientSource& grads);
  // The same step with gradients already in the backend's memory (device
  // pointers on CUDA), converted into the buckets there. Errors as above,
  // plus INVALID_ARGUMENT for a null or mis-sized gradient (nothing has
  // changed).
  absl::StatusOr<StepStats> Step(BackendGradientSource& grads);

  // The step in three calls (NOTE [Gradient hand-off]). BeginStep: as
  // CheckUsable, plus FAILED_PRECONDITION when a step is already open.
  // GradReady: FAILED_PRECONDITION (no step open), NOT_FOUND (tensor not
  // held), INVALID_ARGUMENT (handed over twice, wrong size or a null device
  // gradient: nothing changed). FinishStep: as Step().
  absl::Status BeginStep();
  absl::Status GradReady(int tensor, absl::Span<const float> grad);
  absl::Status GradReady(int tensor, const BackendGradient& grad);
  absl::StatusOr<StepStats> FinishStep();
  // Whether steps run the pipelined schedule (NOTE [Pipelined step]).
  bool pipelined() const { return pipeline_ != nullptr; }

  // NOTE [Part storage]
  // Where a held part's model copy and gradient live in the optimizer's own
  // buffers, so a training program can keep its parameters and gradients
  // there instead of in memory of its own (as Paddle's parameters and
  // gradients are views of its fused param_storage / grad_storage): then a
  // step reads the gradients and writes the parameters in place, with no
  // copy at all. Set only with the CPU backend (host memory) and when one
  // bucket entry covers the whole part (always, except a 3-D expert stack
  // whose matrices have several owners); otherwise the program copies in
  // (PartGradient spans) and out (ReadModelCopy).
  //   params: the part's model copy, `numel` elements of the tensor's dtype
  //     (float for FP32, 16-bit words for BF16/FP16), written by every
  //     Step() and RestoreFromState(); the program may read it at any time
  //     and write it only through SetParameter.
  //   grads: the part's gradient slot in the bucket, `numel` elements of the
  //     plan's gradient dtype. A GradientSource that returns exactly this
  //     span (FP32 gradients only) hands its gradient over without a copy.
  //     The step reduces the bucket in place, so after Step() the slot holds
  //     an unspecified value: write or zero it before the next step.
  // Both pointers stay valid for the optimizer's lifetime.
  struct PartStorage {
    void* params = nullptr;
    v1::DType param_dtype = v1::FP32;
    void* grads = nullptr;
    v1::DType grad_dtype = v1::FP32;
    int64_t numel = 0;
  };
  // NOT_FOUND (not held), FAILED_PRECONDITION (not in host memory, or split
  // over several bucket entries: see above).
  absl::StatusOr<PartStorage> HostPartStorage(int tensor);

  // The model copy of the rank's part of `tensor` as fp32 values.
  // Possible errors: NOT_FOUND, INVALID_ARGUMENT (out has the wrong size).
  absl::Status ReadModelCopy(int tensor, absl::Span<float> out) const;
  absl::StatusOr<std::vector<float>> ModelCopy(int tensor) const;

  // The full fp32 master of every tensor part in the rank's groups, by plan
  // index (part values, as ReadModelCopy): owners broadcast their Muon
  // masters and the AdamW shards are all-gathered. A collective (see above);
  // for dumps and comparisons, not for the training loop.
  // Possible errors: FAILED_PRECONDITION (broken), the communicators' codes.
  absl::StatusOr<std::map<int, std::vector<float>>> GatherMasters();

  // Bytes of optimizer state actually allocated (equals the plan's
  // RankPlan.optimizer_state_bytes), of model-copy buffers and of gradient
  // buffers.
  int64_t optimizer_state_bytes() const;
  int64_t model_copy_bytes() const;
  int64_t gradient_buffer_bytes() const;

  // Checkpointing (checkpoint/state.h). The rank's optimizer state as shards
  // of host memory, in checkpoint::ExpectedShards(view) order: save them, or
  // fill them from a checkpoint of any plan of the same model and call
  // RestoreFromState. With the CPU backend the spans point into the
  // optimizer's own buffers; with a device backend into host copies taken by
  // this call (RestoreFromState copies them back). The spans stay valid
  // until the next StateShards() call.
  // Possible errors: INTERNAL (the view and the buffers disagree).
  absl::StatusOr<std::vector<checkpoint::StateShard>> StateShards();
  checkpoint::Scalars scalars() const;
  // After the shards were filled: takes the step count and beta powers and
  // rebuilds every model copy from the masters (the same cast, broadcast and
  // all-gather as a step's sync), so every rank of every group agrees. A
  // collective, like Step().
  // Possible errors: FAILED_PRECONDITION (broken), the communicators' codes.
  absl::Status RestoreFromState(const checkpoint::Scalars& scalars);

  // Makes every rank's model copies the owners' values without changing any
  // optimizer state: owners cast their masters into the model copy and the
  // step's sync (broadcast, all-gather) runs. After SetParameter on ranks
  // that may have set different values (unseeded initialisation), this is
  // what makes them agree, as DDP's broadcast of the initial parameters does.
  // A collective, like Step().
  // Possible errors: FAILED_PRECONDITION (a parameter never set; broken),
  // the communicators' codes.
  absl::Status SyncModelCopies();

  int64_t steps_done() const { return steps_; }
  float lr() const { return config_.lr; }
  // For schedules: the learning rate of the following steps.
  // Possible errors: INVALID_ARGUMENT (negative or not finite).
  absl::Status SetLearningRate(float lr);

 private:
  struct GroupState {
    std::unique_ptr<CountingCommunicator> comm;  // null for a group of one
  };
  struct MuonBucketState {
    internal::BackendBuffer params;  // bucket dtype: the model copy
    internal::BackendBuffer grads;   // gradient dtype
  };
  // NOTE [FP32 masters]: a BF16/FP16 parameter's master is an fp32 buffer
  // of its own; an FP32 parameter's master is a view (BackendBuffer::View)
  // of its model copy in the bucket's parameter buffer, at the owned range
  // (as Paddle's multi-precision keeps masters only for 16-bit parameters).
  // The update then writes the model copy in place, every master -> model
  // copy conversion between the same elements is skipped
  // (BackendBuffer::ConvertFrom), and an AdamW bucket's all-gather sends the
  // fp32 shard from its place in the bucket (in place). Checkpoints still
  // hold a master shard for every tensor: loading an fp32 one writes the
  // model copy. Values are the same either way: an fp32 model copy always
  // equalled its master.
  struct MuonShardState {
    internal::BackendBuffer master;  // fp32 (NOTE [FP32 masters])
    internal::BackendBuffer momentum;
    bool with_decay = true;
  };
  struct AdamwBucketState {
    internal::BackendBuffer params;       // bucket dtype: the model copy
    internal::BackendBuffer grads;        // gradient dtype, whole bucket
    internal::BackendBuffer shard_grads;  // gradient dtype, this shard (groups > 1)
    // Bucket dtype, this shard (groups > 1, BF16/FP16): the all-gather's
    // input. An fp32 shard is sent from its place in `params`.
    internal::BackendBuffer staging;
    internal::BackendBuffer master;  // fp32, this shard (NOTE [FP32 masters])
    internal::BackendBuffer moment1;
    internal::BackendBuffer moment2;
    std::vector<bool> segment_decay;  // per layout segment
  };

  // A bucket of either kind: a muon bucket b is key b, an AdamW bucket b is
  // key muon_buckets + b (the pipeline's events are numbered by key).
  struct BucketKey {
    bool muon = false;
    int bucket = 0;
  };

  ShardedOptimizer(v1::RankView view, kernels::KernelBackend* backend, const OptimizerConfig& config,
                   const StepOptions& step);

  absl::Status Init(const CommGroups& comms);
  absl::Status InitPipeline();
  absl::Status InitComms(const CommGroups& comms);
  absl::Status Allocate();

  const internal::PartLayout* FindPart(int tensor) const;
  // Writes already rounded values of a part into its model copies and the
  // masters this rank owns of it.
  absl::Status WriteParameter(const internal::PartLayout& part, absl::Span<const float> rounded);
  const v1::PlannedTensor& Spec(const internal::PartLayout& part) const;
  const v1::BucketEntry& Entry(const internal::EntryRef& ref) const;
  internal::BackendBuffer& Params(const internal::EntryRef& ref);
  const internal::BackendBuffer& Params(const internal::EntryRef& ref) const;
  absl::StatusOr<internal::BackendBuffer> NewBuffer(v1::DType dtype, int64_t numel);
  // The fp32 master of `numel` elements of `params` from `offset`: a buffer
  // of its own, or for fp32 `params` a view of them (NOTE [FP32 masters]).
  absl::StatusOr<internal::BackendBuffer> NewMaster(internal::BackendBuffer& params, int64_t offset, int64_t numel);
  // Where an AdamW bucket's update writes its model values: the staging
  // buffer (from 0), or `params` from the shard's begin (a group of one, or
  // an fp32 shard updated in place). `*offset` is that start.
  internal::BackendBuffer& AdamwModel(int bucket, int64_t* offset);

  // OK when no step is open, FAILED_PRECONDITION otherwise.
  absl::Status CheckNoOpenStep() const;
  // Not broken, no step open, every parameter set.
  absl::Status CheckUsable() const;
  // BeginStep, hand_over(part) for every part (last first), FinishStep.
  absl::StatusOr<StepStats> HandOverAll(absl::FunctionRef<absl::Status(size_t part)> hand_over);
  // INVALID_ARGUMENT unless a gradient of `numel` values (`non_null`: at a
  // real address) fits `part`.
  absl::Status CheckGradientSize(const internal::PartLayout& part, int64_t numel, bool non_null) const;
  // Copy a checked gradient into its bucket entries.
  absl::Status PackPart(const internal::PartLayout& part, absl::Span<const float> grad);
  absl::Status PackBackendPart(const internal::PartLayout& part, const BackendGradient& grad);
  // Zeroes what no entry of a gradient bucket covers.
  absl::Status ZeroBucketGaps();
  absl::Status ReduceGradients();
  absl::Status RunMuon();
  absl::Status RunAdamw();
  // One owned Muon shard / one AdamW bucket's shard, as RunMuon/RunAdamw do
  // for all of them (without the backend synchronisation).
  absl::Status UpdateMuonShard(int shard);
  // Every owned shard of a Muon bucket, batched by shape (NOTE [Batched
  // Muon] in sharded_optimizer_step.cc).
  absl::Status UpdateMuonBucket(int bucket);
  absl::StatusOr<kernels::MuonTensors> MuonTensorsOf(int shard);
  // NOTE [Tensor-parallel Muon] (sharded_optimizer_tp.cc).
  absl::Status AllocateTpScratch();
  // The owned TP shards of one Muon bucket that share a TP op and NS rank
  // (-1: all-gathered), in owned order; their NS inputs lie together in
  // tp_update_ from `offset` (shard k at offset + shard_offsets[k]).
  struct TpBatch {
    int root = -1;
    std::vector<int> shards;
    std::vector<int64_t> shard_offsets;
    int64_t offset = 0;
    int64_t numel = 0;
    // Where this rank assembles the batch's whole matrices (tp x numel
    // elements of tp_segments_ and tp_whole_), when it runs their NS.
    int64_t scratch = 0;
  };
  void PlanTpBatches();
  absl::Status UpdateTpBucket(int bucket);
  absl::Status ExchangeTpInputs(const std::vector<TpBatch>& batches);
  absl::Status ReturnTpResults(const std::vector<TpBatch>& batches);
  // Whole matrices from every TP rank's shards in tp_segments_, NS, and
  // back (NOTE [Tensor-parallel Muon]).
  absl::Status OrthogonalizeTpBatch(const TpBatch& batch);
  absl::Status CopyTpShards(const TpBatch& batch, bool to_whole);
  bool RunsNs(const TpBatch& batch) const;
  bool IsTp(int shard) const { return layout_.owned[shard].tp.op != v1::TP_OP_NONE; }
  int TpSize() const { return std::max(1, view_.topology().tp()); }
  absl::Status CastMuonShard(int shard);
  absl::Status UpdateAdamwBucket(int bucket);
  void AdvanceBetaPows();

  // The collectives of one bucket, as ReduceGradients / SyncParameters
  // issue them.
  absl::Status ReduceBucket(Communicator& comm, const BucketKey& key);
  absl::Status SyncBucket(Communicator& comm, const BucketKey& key);
  // The group's Muon buckets, then its AdamW buckets, by index: the
  // sequential schedule's collective order within a group.
  std::vector<BucketKey> GroupBuckets(int group) const;

  // Hand-off and the pipelined schedule (sharded_optimizer_pipeline.cc).
  absl::Status CheckHandOff(int tensor, const internal::PartLayout** part) const;
  void PartHandedOver(const internal::PartLayout& part);
  void BucketGradientsIn(const BucketKey& key);
  absl::StatusOr<StepStats> FinishSequential();
  absl::StatusOr<StepStats> FinishPipelined();
  void PostLaneOps();
  // A lane's op: the bucket's reduce (or its sync), timed.
  absl::Status LaneCollective(const BucketKey& key, bool reduce);
  // Runs `work`, a bucket's part of the step, and with StepOptions::trace
  // records it as a span (NOTE [Step trace]).
  absl::Status Traced(StepSpan::Kind kind, const BucketKey& key, int lane, absl::FunctionRef<absl::Status()> work);
  absl::Status UpdateBucket(const BucketKey& key);
  // The updating thread's part of a pipelined step: every bucket this rank
  // updates, as it is reduced, until all are done or the step failed.
  void UpdateAsReduced();
  // The TP buckets reduced so far and the next one's position in tp_order_.
  struct TpTurns {
    std::vector<bool> reduced;  // per muon bucket
    size_t next = 0;
  };
  // The buckets to update now that `reduced` is (NOTE [Pipelined step]).
  std::vector<BucketKey> InTurn(const BucketKey& reduced, TpTurns* turns) const;
  // UpdateBucket on each, in order, each then marked updated for its sync.
  absl::Status UpdateReduced(absl::Span<const BucketKey> keys);
  void OrderTpBuckets();
  int Key(const BucketKey& key) const { return key.muon ? key.bucket : view_.muon_buckets_size() + key.bucket; }
  BucketKey KeyBucket(int key) const;
  int BucketCount() const { return view_.muon_buckets_size() + view_.adamw_buckets_size(); }
  // Whether this rank updates the bucket (AdamW: always; Muon: its owner).
  bool Updates(const BucketKey& key) const;
  int GroupOf(const BucketKey& key) const;
  void AbortComms(const absl::Status& reason);
  // Fills total_seconds and the comm bytes of the step, counts it.
  StepStats CloseStep(StepStats stats);
  absl::Status SyncParameters();
  // Uploads the checkpoint mirrors (device backends) and casts every owned
  // master into its model copy, as a step does before its sync.
  absl::Status RebuildModelCopies();
  // Runs issue(group, comm) for every group of more than one rank, in
  // ascending id, each inside GroupStart/GroupEnd followed by Synchronize.
  absl::Status ForEachCommGroup(absl::FunctionRef<absl::Status(int group, Communicator& comm)> issue);
  // fp32 view of `n` elements of a gradient buffer at `offset` (widened into
  // scratch_ for 16-bit gradients; valid until the next call).
  absl::StatusOr<const float*> GradFloats(const internal::BackendBuffer& grads, int64_t offset, int64_t n);
  // Host memory for the checkpoint shard of `buffer` (see StateShards).
  absl::StatusOr<absl::Span<float>> HostState(internal::BackendBuffer& buffer);
  bool host_memory() const { return backend_->device_kind() == kernels::DeviceKind::kCpu; }
  StepCommBytes CommSnapshot() const;
  absl::Status Broken(absl::Status status);

  v1::RankView view_;
  internal::ViewLayout layout_;
  kernels::KernelBackend* const backend_;  // not owned
  OptimizerConfig config_;
  v1::DType grad_dtype_ = v1::FP32;

  std::vector<GroupState> groups_;  // parallel to layout_.groups
  std::vector<MuonBucketState> muon_;
  std::vector<MuonShardState> shards_;  // parallel to layout_.owned
  std::vector<AdamwBucketState> adamw_;
  std::vector<HeldTensor> held_;  // parallel to layout_.parts
  std::vector<bool> initialised_;
  // Per part: owned shards and (adamw bucket, segment) pairs, for SetParameter.
  std::vector<std::vector<int>> shards_of_part_;
  std::vector<std::vector<std::pair<int, int>>> segments_of_part_;

  float beta1_pow_ = 0;  // NOTE [Beta powers]
  float beta2_pow_ = 0;
  internal::BackendBuffer scratch_;  // fp32, for 16-bit gradients
  // Tensor-parallel Muon, sized for the largest matrix: one shard's NS
  // input / result, every TP rank's shards in rank order, a whole matrix.
  internal::BackendBuffer tp_update_;
  internal::BackendBuffer tp_segments_;
  internal::BackendBuffer tp_whole_;
  std::vector<std::vector<TpBatch>> tp_batches_;  // per muon bucket
  // Device backends only: host copies of the state buffers handed out by
  // StateShards(), written back by RestoreFromState().
  absl::flat_hash_map<internal::BackendBuffer*, std::vector<float>> mirrors_;
  absl::Status broken_;
  int64_t steps_ = 0;

  StepOptions step_options_;
  // Pipelined schedule only (NOTE [Pipelined step]).
  std::unique_ptr<internal::StepPipeline> pipeline_;
  std::vector<int> lane_of_group_;               // -1: no lane (group of one)
  std::vector<std::vector<BucketKey>> order_;    // per group: hand-off order
  std::vector<std::vector<int>> owned_in_muon_;  // per muon bucket: shards_ positions
  std::vector<int> tp_order_;                    // Muon buckets with TP batches, in update order
  // The open step (NOTE [Gradient hand-off]).
  bool in_step_ = false;
  std::vector<bool> handed_;       // per part
  std::vector<int> entries_left_;  // per bucket key: entries not handed over
  StepCommBytes step_comm_before_;
  std::chrono::steady_clock::time_point step_start_;
  // Per lane, this step's time in reduces / syncs (each written by its lane
  // only, read after the step's Finish()).
  std::vector<int64_t> reduce_ns_;
  std::vector<int64_t> sync_ns_;
  double muon_seconds_ = 0;
  double adamw_seconds_ = 0;
  // NOTE [Step trace]: on while a traced step runs; the spans are added by
  // the lanes and the updating thread.
  bool tracing_ = false;
  absl::Time step_started_wall_;
  absl::Mutex spans_mu_;
  std::vector<StepSpan> spans_ ABSL_GUARDED_BY(spans_mu_);
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_OPTIMIZER_SHARDED_OPTIMIZER_H_
