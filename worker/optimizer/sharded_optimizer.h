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
// total_seconds, their sum may exceed it. On a device backend the same
// order is issued onto streams, ordered by events instead of lanes (NOTE
// [Stream-pipelined step] in internal/step_scheduler_streamed.cc; there
// `auto` is the sequential schedule, and tp = 1 only).
// The unit of overlap is the bucket, and a Muon bucket may be cut into
// pieces for it (NOTE [Step pieces] in internal/bucket_split.h): the
// optimizer runs its view with the pieces as buckets, on both schedules.
// With tp > 1 a bucket whose matrices are TP-split exchanges their shards
// over the TP group while it is updated (NOTE [Tensor-parallel Muon]). The
// updating thread takes those buckets round by round (NOTE [TP exchange
// rounds] in plan/tp_rounds.h), in one order on every rank of the TP group
// (TpMuonExchange::rounds()): a round is updated once all its buckets and
// the rounds before it are reduced, while other buckets are updated as
// they come. Nothing waits in a cycle: reduces wait for gradients only, and every
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
// reference's shards. Batched per exchange round (NOTE [TP exchange rounds]
// in plan/tp_rounds.h: consecutive buckets in the hand-off order, until
// every TP rank has a matrix to orthogonalise): one Gather per NS rank (and
// one AllGather) carries every matrix of the round's TP shards, each rank
// then orthogonalises the matrices it was given side by side with the
// others (batched per shard, so a stack's experts go through one call), and
// one Scatter per NS rank returns them: 2 x tp collectives per round, not
// per matrix or bucket, each direction one group call (RunGrouped: NCCL
// runs a round's gathers at once). These collectives run in the Muon phase, on the
// updating thread, round after round in one order on every rank of the TP
// group, on both schedules; in the pipelined one each round waits until its
// buckets are reduced and the rounds before it are done (NOTE [Pipelined
// step]).
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
//
// NOTE [FP32 masters]
// A BF16/FP16 parameter's master is an fp32 buffer of its own; an FP32
// parameter's master is a view (BackendBuffer::View) of its model copy in
// the bucket's parameter buffer, at the owned range (as Paddle's
// multi-precision keeps masters only for 16-bit parameters). The update then
// writes the model copy in place, every master -> model copy conversion
// between the same elements is skipped (BackendBuffer::ConvertFrom), and an
// AdamW bucket's all-gather sends the fp32 shard from its place in the
// bucket (in place). Checkpoints still hold a master shard for every tensor:
// loading an fp32 one writes the model copy. Values are the same either way:
// an fp32 model copy always equalled its master.
//
// Structure: ShardedOptimizer is the facade over parts of one role each
// (worker/optimizer/internal/), built in this order and each given the ones
// before it:
//   OptimizerLayout   the view the steps run, indexed; held parts, bucket keys
//   GroupComms        the groups' (counting) communicators
//   ParameterBuffers  model copies, masters, momenta and moments; the sync
//   GradientBuffers   gradient buckets: packing, the reduce, fp32 views
//   TpMuonExchange    NOTE [Tensor-parallel Muon]
//   BucketUpdater     Muon / AdamW of one bucket, lr and beta powers
//   OptimizerStateIo  checkpoint shards and GatherMasters
//   StepScheduler     the open step and its schedule (sequential or
//                     pipelined), with GradientHandOff and StepRecorder
// The facade keeps what spans them: whether every parameter was set, the
// broken state, the step count.

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "checkpoint/state.h"
#include "kernels/kernel_backend.h"
#include "muonshard/v1/plan.pb.h"
#include "worker/comm/communicator.h"
#include "worker/optimizer/gradient_source.h"
#include "worker/optimizer/internal/bucket_updater.h"
#include "worker/optimizer/internal/gradient_buffers.h"
#include "worker/optimizer/internal/group_comms.h"
#include "worker/optimizer/internal/optimizer_layout.h"
#include "worker/optimizer/internal/optimizer_state_io.h"
#include "worker/optimizer/internal/parameter_buffers.h"
#include "worker/optimizer/internal/step_scheduler.h"
#include "worker/optimizer/internal/tp_muon_exchange.h"
#include "worker/optimizer/optimizer_config.h"
#include "worker/optimizer/step_stats.h"

namespace muonshard::worker {

class ShardedOptimizer {
 public:
  // The communicator of every group the rank is in, by plan group id
  // (CommGroup.id), each with the group's size and this rank's group rank.
  // A group of one rank may be left out.
  using CommGroups = internal::CommGroups;

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

  int rank() const { return layout_->rank(); }
  // The view the steps run: the one given to Create, with its Muon buckets
  // in pieces (StepOptions::muon_piece_bytes).
  const v1::RankView& view() const { return layout_->view(); }
  // The tensor parts this rank holds, by ascending plan index.
  const std::vector<HeldTensor>& held_tensors() const { return layout_->held(); }

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
  bool pipelined() const { return scheduler_->pipelined(); }

  // NOTE [Part storage]
  // Where a held part's model copy and gradient live in the optimizer's own
  // buffers, so a training program can keep its parameters and gradients
  // there instead of in memory of its own (as Paddle's parameters and
  // gradients are views of its fused param_storage / grad_storage): then a
  // step reads the gradients and writes the parameters in place, with no
  // copy at all. Set when one bucket entry covers the whole part (always,
  // except a 3-D expert stack whose matrices have several owners); otherwise
  // the program converts in (a BackendGradient) and out (CopyModelCopiesTo)
  // in the backend. The memory is the kernel backend's: host memory on the
  // CPU backend, device memory on a device backend, where a program keeps
  // its tensors over it (muonshard.torch: DLPack views, a CUDA tensor's
  // storage) and hands the gradient slot back as a BackendGradient, so a
  // step moves no tensor data between host and device.
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
  // NOT_FOUND (not held), FAILED_PRECONDITION (split over several bucket
  // entries: see above).
  absl::StatusOr<PartStorage> BackendPartStorage(int tensor);

  // The model copy of the rank's part of `tensor` as fp32 values.
  // Possible errors: NOT_FOUND, INVALID_ARGUMENT (out has the wrong size).
  absl::Status ReadModelCopy(int tensor, absl::Span<float> out) const;
  // Where CopyModelCopiesTo writes the model copy of the rank's part of
  // plan tensor `tensor`: `numel` elements of `type` at `data`, memory of the
  // backend's space (a caller's tensor on the backend's device that cannot
  // view the part's storage, e.g. an FSDP2 shard).
  struct ModelCopyTarget {
    int tensor = -1;
    void* data = nullptr;
    kernels::ElementType type = kernels::ElementType::kFloat32;
    int64_t numel = 0;
  };
  // Converts each target's model copy into it in the backend (no host copy)
  // and returns when all are written (one backend synchronisation).
  // Possible errors: NOT_FOUND, INVALID_ARGUMENT (a size other than the
  // part's, a null or, on CUDA, host pointer), INTERNAL.
  absl::Status CopyModelCopiesTo(absl::Span<const ModelCopyTarget> targets);

  // Orders the backend's later work (the next step's) after all work issued
  // so far on a stream of the caller's (KernelBackend::WaitForStream): a
  // PyTorch program's current CUDA stream, before a step or a GradReady
  // reads what its backward pass wrote. Steps end with the backend
  // synchronised, so what the caller issues after one sees its results.
  // Possible errors: INVALID_ARGUMENT (a stream on the CPU backend),
  // INTERNAL.
  absl::Status WaitForStream(std::uintptr_t stream) { return backend_->WaitForStream(stream); }
  // The backend's copies between host memory and its own so far
  // (KernelBackend::host_copies): none in a step whose gradients and
  // parameters stay in the backend's memory.
  int64_t host_copies() const { return backend_->host_copies(); }
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
  float lr() const { return updater_->config().lr; }
  // For schedules: the learning rate of the following steps.
  // Possible errors: INVALID_ARGUMENT (negative or not finite).
  absl::Status SetLearningRate(float lr);

 private:
  explicit ShardedOptimizer(kernels::KernelBackend* backend) : backend_(backend) {}

  // Not broken, no step open, every parameter set.
  absl::Status CheckUsable() const;
  // BeginStep, hand_over(part) for every part (last first), FinishStep.
  absl::StatusOr<StepStats> HandOverAll(absl::FunctionRef<absl::Status(size_t part)> hand_over);
  // GradReady of a gradient of `numel` values (`non_null`: at a real
  // address) that pack(part) copies into the part's buckets.
  absl::Status HandOver(int tensor, int64_t numel, bool non_null,
                        absl::FunctionRef<absl::Status(const internal::PartLayout& part)> pack);
  // Breaks the optimizer (closing an open step) after `status`; returns it.
  absl::Status Broken(absl::Status status);

  kernels::KernelBackend* const backend_;  // not owned
  // The parts, in construction order: each refers to those before it, so
  // they are destroyed after it (the scheduler, whose lanes use all of
  // them, first).
  std::unique_ptr<internal::OptimizerLayout> layout_;
  std::unique_ptr<internal::GroupComms> comms_;
  std::unique_ptr<internal::ParameterBuffers> params_;
  std::unique_ptr<internal::GradientBuffers> grads_;
  std::unique_ptr<internal::TpMuonExchange> tp_;
  std::unique_ptr<internal::BucketUpdater> updater_;
  std::unique_ptr<internal::OptimizerStateIo> state_io_;
  std::unique_ptr<internal::StepScheduler> scheduler_;
  std::vector<bool> initialised_;  // per held part: set by SetParameter
  absl::Status broken_;
  int64_t steps_ = 0;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_OPTIMIZER_SHARDED_OPTIMIZER_H_
