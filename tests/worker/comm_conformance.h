#ifndef MUONSHARD_TESTS_WORKER_COMM_CONFORMANCE_H_
#define MUONSHARD_TESTS_WORKER_COMM_CONFORMANCE_H_

// The Communicator conformance suite: one value-parameterized fixture that
// every implementation (InProcess, Gloo, NCCL) must pass, over group sizes.
// A backend describes how to create a connected group and how to move test
// data into the memory its collectives use (host or device).
//
// Use: link the `muonshard_comm_conformance` object library into a test
// binary and instantiate
//   INSTANTIATE_TEST_SUITE_P(Gloo, CommunicatorConformanceTest,
//       ::testing::ValuesIn(ConformanceParams(GlooBackend(), {1, 2, 3, 4})),
//       CommConformanceParamName);

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/worker/comm_test_util.h"
#include "worker/comm/communicator.h"

namespace muonshard::worker::testing {

// A buffer in the backend's memory kind.
class CommBuffer {
 public:
  virtual ~CommBuffer() = default;
  // The pointer handed to the communicator (may be null for 0 bytes).
  virtual void* data() = 0;
  // Overwrites the whole buffer; `bytes` has the buffer's size.
  virtual absl::Status Upload(const std::string& bytes) = 0;
  // Reads the whole buffer back to the host.
  virtual absl::StatusOr<std::string> Download() = 0;
};

// Host memory, for CPU backends.
class HostBuffer : public CommBuffer {
 public:
  explicit HostBuffer(int64_t bytes) : bytes_(static_cast<size_t>(bytes), '\0') {}
  void* data() override { return bytes_.empty() ? nullptr : bytes_.data(); }
  absl::Status Upload(const std::string& bytes) override;
  absl::StatusOr<std::string> Download() override { return bytes_; }

 private:
  std::string bytes_;
};

struct CommBackend {
  std::string name;
  // Creates a connected group of `size` communicators, element i of rank i
  // (collective backends create them concurrently, one thread per rank).
  std::function<absl::StatusOr<CommGroup>(int size, absl::Duration timeout)> create_group;
  // Allocates `bytes` in the backend's memory kind for rank `rank` (GPU:
  // on that rank's device).
  std::function<absl::StatusOr<std::unique_ptr<CommBuffer>>(int rank, int64_t bytes)> allocate;
  // Non-empty when the backend cannot run a group of `size` here (e.g. fewer
  // CUDA devices than ranks): the tests skip with this reason.
  std::function<std::string(int size)> unavailable_reason = [](int) { return std::string(); };
};

struct CommConformanceParam {
  CommBackend backend;
  int size = 1;
};

std::vector<CommConformanceParam> ConformanceParams(const CommBackend& backend, const std::vector<int>& sizes);
std::string CommConformanceParamName(const ::testing::TestParamInfo<CommConformanceParam>& info);
void PrintTo(const CommConformanceParam& param, std::ostream* os);

// The outcome of one rank's op: its buffers after the op (and
// Synchronize()).
struct RankBytes {
  std::string in;
  std::string out;
};

class CommunicatorConformanceTest : public ::testing::TestWithParam<CommConformanceParam> {
 protected:
  using RankOp = std::function<absl::Status(Communicator& comm, int rank, void* in, void* out)>;

  void SetUp() override;

  int size() const { return GetParam().size; }
  Communicator& comm(int rank) { return *group_[rank]; }
  CommGroup& group() { return group_; }

  // On every rank: uploads inputs[rank] into `in`, fills `out` (out_bytes
  // [rank] bytes) with 0xAB, runs op, Synchronize()s and downloads both.
  std::vector<absl::StatusOr<RankBytes>> Run(const std::vector<std::string>& inputs,
                                             const std::vector<int64_t>& out_bytes, const RankOp& op);
  // Run() with in-place ops only (no `out`).
  std::vector<absl::StatusOr<RankBytes>> RunInPlace(const std::vector<std::string>& inputs, const RankOp& op);

 private:
  absl::StatusOr<RankBytes> RunOneRank(int rank, const std::string& input, int64_t out_bytes, const RankOp& op);

  CommGroup group_;
};

}  // namespace muonshard::worker::testing

#endif  // MUONSHARD_TESTS_WORKER_COMM_CONFORMANCE_H_
