#ifndef MUONSHARD_CLI_CLI_COMMON_H_
#define MUONSHARD_CLI_CLI_COMMON_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/flags.h"
#include "google/protobuf/message.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard::cli {

// House exit codes: 0 ok, 1 runtime/RPC failure, 2 bad usage or bad input.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// Prints `status` to stderr and maps it to an exit code: INVALID_ARGUMENT,
// NOT_FOUND of an input file and the like are usage errors (2); everything
// else is a runtime failure (1).
int ReportError(const absl::Status& status);
int ExitCodeFor(const absl::Status& status);

// What RESOURCE_EXHAUSTED from the coordinator means for a call.
enum class RpcLimits {
  // The request itself is over a limit (submit: --max-tensors,
  // --max-world-size, --max-message-bytes): the user's input, exit 2.
  kOnTheRequest,
  // The server is full (--max-watchers, its request queue): exit 1, as a
  // later retry can succeed.
  kServerCapacity,
};

// Exit code of a failed coordinator RPC; the one table of them:
//   2 (the user's input): INVALID_ARGUMENT (a bad manifest, rank, name),
//     NOT_FOUND (a version or job that does not exist), OUT_OF_RANGE (a
//     cursor past the latest version), RESOURCE_EXHAUSTED with
//     RpcLimits::kOnTheRequest;
//   1 (a runtime failure): UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL,
//     UNAUTHENTICATED, FAILED_PRECONDITION (the coordinator's state, e.g.
//     nothing submitted yet: the same command can succeed later),
//     RESOURCE_EXHAUSTED with RpcLimits::kServerCapacity, everything else.
// A submit turned away because the server's request queue is full shares
// RESOURCE_EXHAUSTED with the request limits and so exits 2 as well.
int ExitCodeForRpc(const absl::Status& status, RpcLimits limits);

// Parses flags, handling --help (usage on stdout, exit 0), --version (where
// the command has no flag of that name) and bad flags (the message and a
// line naming `COMMAND --help` on stderr, exit 2); prints the warnings of
// deprecated flags. Returns -1 to continue.
int ParseFlagsOrExit(FlagSet& flags, const std::vector<std::string>& args, std::vector<std::string>* positional);

// Prints "error: <message>" and the line naming `COMMAND --help`; returns 2.
int UsageError(const FlagSet& flags, absl::string_view message);

// While one exists, ParseFlagsOrExit hands each command's FlagSet to
// `observer` and returns 0 instead of parsing: `muonshardctl completion` and
// global flags before the command learn every command's flags this way, from
// the FlagSets themselves, by running the command. Not thread-safe; nests.
class ScopedFlagSetObserver {
 public:
  explicit ScopedFlagSetObserver(std::function<void(const FlagSet&)> observer);
  ~ScopedFlagSetObserver();
  ScopedFlagSetObserver(const ScopedFlagSetObserver&) = delete;
  ScopedFlagSetObserver& operator=(const ScopedFlagSetObserver&) = delete;

 private:
  std::function<void(const FlagSet&)> observer_;
  const std::function<void(const FlagSet&)>* previous_;
};

// Reads a message from proto3 JSON, or binary proto when the path ends in
// ".pb". Errors name the file; a missing file is INVALID_ARGUMENT (bad input).
absl::Status ReadMessageFile(const std::string& path, google::protobuf::Message* message);

// Output format flag value: "table" or "json"; INVALID_ARGUMENT otherwise.
absl::Status CheckOutputFormat(const std::string& format);

// Prints `message` as proto3 JSON (original field names) to stdout.
int PrintJson(const google::protobuf::Message& message);

// Topology and policy flags shared by `plan`, `submit` and `compare`.
struct PlanFlags {
  std::string manifest;
  int world_size = 0;
  int pp = 1;
  int ep = 1;
  int tp = 1;
  std::string tp_muon = "distributed";
  std::string muon_reduce = "owner";
  std::string policy = "seed";
  int comm_buffer_mb = 256;
  int ns_steps = 5;
  bool per_dtype = false;
  std::vector<std::string> exclude;
  std::string device_memory;  // "80GiB" or one size per rank, comma-separated
  int gpus_per_node = 0;      // 0: not known

  void Register(FlagSet& flags);
  // Reads the manifest and builds the request; INVALID_ARGUMENT on bad input.
  absl::StatusOr<v1::PlanRequest> ToRequest() const;
};

absl::StatusOr<v1::Policy> ParsePolicy(const std::string& name);
// --tp-muon: distributed | duplicated | sharded.
absl::StatusOr<v1::TpMuonMode> ParseTpMuon(const std::string& name);
// --muon-reduce: owner | scatter-rounds.
absl::StatusOr<v1::MuonReduce> ParseMuonReduce(const std::string& name);

// After `status` refused `request` because a rank does not fit its device
// memory (planner::IsFitError), prints on stderr the smallest world size that
// fits (planner::MinWorldSizeThatFits), or why none does. Nothing otherwise.
void PrintFitHint(const absl::Status& status, const v1::PlanRequest& request);

}  // namespace muonshard::cli

#endif  // MUONSHARD_CLI_CLI_COMMON_H_
