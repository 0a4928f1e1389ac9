#ifndef MUONSHARD_TESTS_WORKER_COMM_TEST_UTIL_H_
#define MUONSHARD_TESTS_WORKER_COMM_TEST_UTIL_H_

// Helpers for multi-rank communicator tests: one thread per rank (the gloo
// BaseTest::spawn idea), byte/float conversions and tolerant comparisons.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

namespace muonshard::worker::testing {

// Runs fn(rank) for rank in [0, size) on one thread each and returns the
// results in rank order. Every wait inside fn must be bounded (the
// communicators' timeouts are), so this always returns.
template <typename T>
std::vector<absl::StatusOr<T>> RunRanks(int size, const std::function<absl::StatusOr<T>(int)>& fn) {
  std::vector<absl::StatusOr<T>> results;
  results.reserve(size);
  for (int rank = 0; rank < size; ++rank) {
    results.emplace_back(absl::UnknownError("not run"));
  }
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] { results[rank] = fn(rank); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// The same for functions returning a plain status.
std::vector<absl::Status> RunRanksStatus(int size, const std::function<absl::Status(int)>& fn);

// A connected group of `size` communicators, element i of rank i.
using CommGroup = std::vector<std::unique_ptr<Communicator>>;

// An in-process group (InProcessCommunicator) with `timeout`.
absl::StatusOr<CommGroup> CreateInProcessGroup(int size, absl::Duration timeout);
// A Gloo group over TCP on 127.0.0.1, one thread per rank creating its
// communicator concurrently through a fresh InMemoryRendezvousStore under
// `key_prefix`.
absl::StatusOr<CommGroup> CreateGlooGroup(int size, absl::Duration timeout,
                                          const std::string& key_prefix = "test/gloo/");

// Creates a connected group of `size` ranks; `tag` tells groups made for
// one test apart (Gloo: the rendezvous key prefix).
using GroupFactory = std::function<absl::StatusOr<CommGroup>(int size, absl::Duration timeout, const std::string& tag)>;

// A group of `size` ranks on nodes of `per_node` (rank r on node r /
// per_node): HierarchicalCommunicators built of groups from `create` where
// the ranks form a grid (NOTE [Node-local collectives] in plan/node_grid.h),
// the flat group from `create` where they do not.
absl::StatusOr<CommGroup> CreateHierarchicalGroup(int size, int per_node, absl::Duration timeout,
                                                  const GroupFactory& create);

// Encodes values of `dtype` (rounded to nearest even for 16-bit types).
std::string EncodeFloats(const std::vector<float>& values, CommDType dtype);
// Decodes bytes of `dtype` into floats.
std::vector<float> DecodeFloats(const std::string& bytes, CommDType dtype);
// Raw 16-bit patterns as bytes (for dtype-agnostic moves of bf16/f16).
std::string EncodeBits16(const std::vector<uint16_t>& bits);

// Relative tolerance for comparing a reduction result of `dtype` across
// backends (fp32: summation order; 16-bit: one ulp of rounding).
double RelativeTolerance(CommDType dtype);

}  // namespace muonshard::worker::testing

#endif  // MUONSHARD_TESTS_WORKER_COMM_TEST_UTIL_H_
