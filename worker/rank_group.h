#ifndef MUONSHARD_WORKER_RANK_GROUP_H_
#define MUONSHARD_WORKER_RANK_GROUP_H_

// RankGroup: what a RankSession computes with (steps 0 and 4-6 of
// rank_session.h). The kernel backend (CPU with its BLAS thread budget, or
// CUDA on the rank's device), created once and kept across recoveries; and
// the group of the membership's generation: its rendezvous store, the
// "group" barrier, one communicator per comm group holding this rank (in
// ascending group id), the buddy-copy channel (NOTE [Buddy copies]) and the
// ShardedOptimizer on them. Every communicator and the channel are
// registered with the AbortOnLoss (NOTE [Prompt aborts]). NOTE [Recovery]:
// Dissolve() destroys the generation's group (the optimizer, then the
// communicators, then the store); Form() builds the next one.
//
// Thread-compatible: the session's thread drives it. `options`, `config`,
// `membership` and `aborts` must outlive it; the membership must be
// connected and joined before Form().

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/grpc_rendezvous_store.h"
#include "kernels/kernel_backend.h"
#include "muonshard/v1/plan.pb.h"
#include "worker/abort_on_loss.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/optimizer/optimizer_config.h"
#include "worker/optimizer/sharded_optimizer.h"
#include "worker/rank_membership.h"
#include "worker/rank_session_options.h"

namespace muonshard::worker {

class RankGroup {
 public:
  RankGroup(const RankSessionOptions& options, const OptimizerConfig& config, const RankMembership& membership,
            AbortOnLoss& aborts);
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;
  // Dissolve(), then the backend.
  ~RankGroup();

  // Step 0 (nccl): this process sees a CUDA device (FAILED_PRECONDITION in
  // a build without CUDA, UNAVAILABLE without a device). OK for gloo.
  absl::Status CheckDevices();
  // The nccl device when it can be told before joining (the JoinJob
  // identity); nullopt otherwise, and for gloo.
  std::optional<int> KnownCudaDevice() const;
  // Step 4, once: the kernel backend for the membership's rank.
  absl::Status CreateBackend();

  // Steps 5-6 in the membership's generation: opens its rendezvous store,
  // waits up to `wait` for every rank of it (the "group" barrier, which
  // checks NOTE [Step agreement]), creates the communicators, the buddy
  // channel and the optimizer. On an error the group stays partly built
  // (has no optimizer) until Dissolve().
  absl::Status Form(absl::Duration wait);
  // Destroys the optimizer, the communicators, the buddy channel and the
  // store, in that order. The backend lives on.
  void Dissolve();

  bool formed() const { return optimizer_ != nullptr; }
  // OK when formed; FAILED_PRECONDITION naming the rank otherwise.
  absl::Status CheckFormed() const;
  // REQUIRES: formed().
  ShardedOptimizer& optimizer() { return *optimizer_; }
  const ShardedOptimizer& optimizer() const { return *optimizer_; }
  client::GrpcRendezvousStore& store() { return *store_; }
  // The buddy-copy channel; null without buddy copies or a group.
  ByteChannel* buddy_channel() { return buddy_channel_.get(); }

  // RankSession::Barrier: CheckFormed(), then every rank's key
  // "<name>/<rank>" in the store, each wait bounded by comm_timeout.
  absl::Status Barrier(const std::string& name);

  int blas_threads() const { return blas_threads_; }
  int cuda_device() const { return cuda_device_; }
  // RankSession::Describe.
  std::string Describe() const;

 private:
  bool nccl() const { return options_.backend == "nccl"; }
  absl::Status WaitForGroup(absl::Duration timeout);
  absl::Status CreateCommunicators();
  absl::Status CreateCommunicator(const v1::CommGroup& group);
  absl::StatusOr<std::unique_ptr<Communicator>> CreateGloo(int rank, int size, const std::string& prefix);
  absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooGroupCommunicator(const v1::CommGroup& group, int group_rank,
                                                                            const std::string& prefix);
  absl::Status CreateBuddyChannel();
  absl::Status CreateOptimizer();

  const RankSessionOptions& options_;
  const OptimizerConfig& config_;
  const RankMembership& membership_;
  AbortOnLoss& aborts_;
  int cuda_devices_ = 0;  // nccl: visible CUDA devices
  int cuda_device_ = -1;  // nccl: this rank's
  int blas_threads_ = 0;  // gloo
  // Before the communicators: NCCL ones enqueue on its stream, so it must
  // be destroyed after them.
  std::unique_ptr<kernels::KernelBackend> backend_;
  std::unique_ptr<client::GrpcRendezvousStore> store_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  int hierarchical_groups_ = 0;                 // of comms_, those inside each node first
  std::unique_ptr<ByteChannel> buddy_channel_;  // NOTE [Buddy copies]
  ShardedOptimizer::CommGroups comm_groups_;
  std::unique_ptr<ShardedOptimizer> optimizer_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_RANK_GROUP_H_
