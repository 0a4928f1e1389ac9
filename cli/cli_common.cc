#include "cli/cli_common.h"

#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/byte_size.h"
#include "common/file_util.h"
#include "common/ordered_json.h"
#include "common/proto_json.h"
#include "common/version.h"
#include "importer/hf_import.h"
#include "plan/fit.h"
#include "plan/fit_search.h"

namespace muonshard::cli {

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

int ExitCodeForRpc(const absl::Status& status, RpcLimits limits) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      return kExitUsage;
    case absl::StatusCode::kResourceExhausted:
      return limits == RpcLimits::kOnTheRequest ? kExitUsage : kExitFailure;
    default:
      return ExitCodeFor(status);  // INVALID_ARGUMENT, OUT_OF_RANGE: 2; the rest 1
  }
}

int ReportError(const absl::Status& status) {
  std::cerr << "error: " << status.message() << " [" << absl::StatusCodeToString(status.code()) << "]\n";
  return ExitCodeFor(status);
}

namespace {

const std::function<void(const FlagSet&)>* flag_set_observer = nullptr;

}  // namespace

ScopedFlagSetObserver::ScopedFlagSetObserver(std::function<void(const FlagSet&)> observer)
    : observer_(std::move(observer)), previous_(flag_set_observer) {
  flag_set_observer = &observer_;
}

ScopedFlagSetObserver::~ScopedFlagSetObserver() { flag_set_observer = previous_; }

int UsageError(const FlagSet& flags, absl::string_view message) {
  std::cerr << "error: " << message << "\n" << flags.UsageHint() << "\n";
  return kExitUsage;
}

int ParseFlagsOrExit(FlagSet& flags, const std::vector<std::string>& args, std::vector<std::string>* positional) {
  if (flag_set_observer != nullptr) {
    (*flag_set_observer)(flags);
    return kExitOk;
  }
  auto parsed = flags.Parse(args);
  for (const std::string& warning : flags.warnings()) std::cerr << "warning: " << warning << "\n";
  if (!parsed.ok()) return UsageError(flags, parsed.status().message());
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return kExitOk;
  }
  if (flags.version_requested()) {
    std::cout << VersionLine("muonshardctl") << "\n";
    return kExitOk;
  }
  *positional = std::move(parsed).value();
  return -1;
}

absl::Status ReadMessageFile(const std::string& path, google::protobuf::Message* message) {
  auto content = ReadFile(path);
  if (!content.ok()) return absl::InvalidArgumentError(content.status().message());
  if (absl::EndsWith(path, ".pb")) {
    if (!message->ParseFromString(*content)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid binary ", message->GetTypeName()));
    }
    return absl::OkStatus();
  }
  absl::Status status = FromJson(*content, message, path);
  // A config.json given where a manifest is wanted: say what to run instead.
  std::string model_type;
  if (status.ok() || message->GetDescriptor() != v1::ModelManifest::descriptor() ||
      !importer::LooksLikeHfConfig(*content, &model_type)) {
    return status;
  }
  return absl::InvalidArgumentError(absl::StrCat(path, " looks like a HuggingFace config.json (model_type ",
                                                 QuoteForMessage(model_type),
                                                 "), not a manifest: run `muonshardctl import-hf ", path, "` first"));
}

absl::Status CheckOutputFormat(const std::string& format) {
  if (format == "table" || format == "json") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("flag --output: \"", format, "\" is not one of table, json"));
}

int PrintJson(const google::protobuf::Message& message) {
  auto json = ToJson(message, /*pretty=*/true);
  if (!json.ok()) return ReportError(json.status());
  std::cout << *json << "\n";
  return kExitOk;
}

void PlanFlags::Register(FlagSet& flags) {
  flags.String("manifest", &manifest, "model manifest (proto3 JSON, or binary proto ending in .pb)");
  flags.Required("manifest");
  flags.Int("world-size", &world_size, "number of ranks");
  flags.Required("world-size");
  flags.Int("pp", &pp, "pipeline stages");
  flags.Int("ep", &ep, "expert parallel degree");
  flags.Int("tp", &tp, "tensor parallel degree (the manifest's tp_split marks the split tensors)");
  flags.String("tp-muon", &tp_muon,
               "with --tp: distributed (one tp rank orthogonalises each split matrix) | duplicated (every one) | "
               "sharded (every tp rank its shard, Gram matrices all-reduced)");
  flags.String("muon-reduce", &muon_reduce,
               "owner (each Muon bucket reduced to its owner, broadcast back) | scatter-rounds (tp 1: a group's "
               "buckets of distinct owners reduce-scattered and all-gathered together)");
  flags.String("policy", &policy, "partition policy: seed | seed-all | balanced");
  flags.Int("comm-buffer-mb", &comm_buffer_mb, "fusion bucket size in MiB");
  flags.Int("ns-steps", &ns_steps, "Newton-Schulz iterations in the FLOP model");
  flags.Bool("per-dtype", &per_dtype, "partition Muon tensors of each dtype separately (Paddle #79740)");
  flags.StringList("muon-exclude", &exclude, "regex of tensors that use AdamW; repeatable; replaces the defaults");
  flags.String("device-memory", &device_memory,
               "device memory per rank, e.g. 80GiB, or one per rank (80GiB,80GiB,40GiB,...): states each rank's "
               "headroom and refuses a plan that does not fit (default: not checked)");
  flags.Int("gpus-per-node", &gpus_per_node,
            "ranks per machine (rank r on node r / N): the workers' Gloo groups reduce and broadcast inside each "
            "node first (default 0: not known, flat rings)");
}

void PrintFitHint(const absl::Status& status, const v1::PlanRequest& request) {
  if (!planner::IsFitError(status)) return;
  absl::StatusOr<int> world = planner::MinWorldSizeThatFits(request);
  if (world.ok()) {
    std::cerr << absl::StrFormat("hint: needs at least %d ranks at pp %d, ep %d, tp %d (--world-size %d)\n", *world,
                                 std::max(1, request.topology().pp()), std::max(1, request.topology().ep()),
                                 std::max(1, request.topology().tp()), *world);
  } else {
    std::cerr << "hint: " << world.status().message() << "\n";
  }
}

absl::StatusOr<v1::Policy> ParsePolicy(const std::string& name) {
  std::string n = absl::AsciiStrToLower(absl::StrReplaceAll(name, {{"_", "-"}}));
  if (n == "seed") return v1::SEED;
  if (n == "seed-all") return v1::SEED_ALL;
  if (n == "balanced") return v1::BALANCED;
  return absl::InvalidArgumentError(
      absl::StrCat("flag --policy: \"", name, "\" is not one of seed, seed-all, balanced"));
}

absl::StatusOr<v1::TpMuonMode> ParseTpMuon(const std::string& name) {
  if (name == "distributed") return v1::TP_MUON_DISTRIBUTED;
  if (name == "duplicated") return v1::TP_MUON_DUPLICATED;
  if (name == "sharded") return v1::TP_MUON_SHARDED;
  return absl::InvalidArgumentError(
      absl::StrCat("flag --tp-muon: \"", name, "\" is not one of distributed, duplicated, sharded"));
}

absl::StatusOr<v1::MuonReduce> ParseMuonReduce(const std::string& name) {
  if (name == "owner") return v1::MUON_REDUCE_TO_OWNER;
  if (name == "scatter-rounds") return v1::MUON_REDUCE_SCATTER_ROUNDS;
  return absl::InvalidArgumentError(
      absl::StrCat("flag --muon-reduce: \"", name, "\" is not one of owner, scatter-rounds"));
}

absl::StatusOr<v1::PlanRequest> PlanFlags::ToRequest() const {
  if (manifest.empty()) return absl::InvalidArgumentError("flag --manifest is required");
  if (world_size <= 0) return absl::InvalidArgumentError("flag --world-size is required and must be >= 1");
  // proto3 cannot tell 0 from unset, so the planner would take 0 as the
  // default 1; reject it here, where the flag can be named.
  if (pp < 1) return absl::InvalidArgumentError(absl::StrCat("flag --pp: must be >= 1, got ", pp));
  if (ep < 1) return absl::InvalidArgumentError(absl::StrCat("flag --ep: must be >= 1, got ", ep));
  if (tp < 1) return absl::InvalidArgumentError(absl::StrCat("flag --tp: must be >= 1, got ", tp));
  const absl::StatusOr<v1::TpMuonMode> mode = ParseTpMuon(tp_muon);
  if (!mode.ok()) return mode.status();
  const absl::StatusOr<v1::MuonReduce> muon_reduce_mode = ParseMuonReduce(muon_reduce);
  if (!muon_reduce_mode.ok()) return muon_reduce_mode.status();
  if (*muon_reduce_mode == v1::MUON_REDUCE_SCATTER_ROUNDS && tp > 1) {
    return absl::InvalidArgumentError(absl::StrCat("flag --muon-reduce: scatter-rounds needs --tp 1, got --tp ", tp));
  }
  if (comm_buffer_mb <= 0) return absl::InvalidArgumentError("flag --comm-buffer-mb: must be >= 1");
  if (ns_steps <= 0) return absl::InvalidArgumentError("flag --ns-steps: must be >= 1");
  if (gpus_per_node < 0) {
    return absl::InvalidArgumentError(absl::StrCat("flag --gpus-per-node: must be >= 0, got ", gpus_per_node));
  }
  v1::PlanRequest request;
  absl::Status s = ReadMessageFile(manifest, request.mutable_manifest());
  if (!s.ok()) return s;
  request.mutable_topology()->set_world_size(world_size);
  request.mutable_topology()->set_pp(pp);
  request.mutable_topology()->set_ep(ep);
  request.mutable_topology()->set_tp(tp);
  request.mutable_topology()->set_gpus_per_node(gpus_per_node);
  auto p = ParsePolicy(policy);
  if (!p.ok()) return p.status();
  v1::PlanPolicy* policy_proto = request.mutable_policy();
  policy_proto->set_policy(*p);
  policy_proto->set_comm_buffer_mb(comm_buffer_mb);
  policy_proto->set_ns_steps(ns_steps);
  policy_proto->set_per_dtype(per_dtype);
  if (tp > 1) policy_proto->set_tp_muon(*mode);
  if (*muon_reduce_mode != v1::MUON_REDUCE_TO_OWNER) policy_proto->set_muon_reduce(*muon_reduce_mode);
  for (const std::string& e : exclude) policy_proto->add_muon_exclude_patterns(e);
  if (!device_memory.empty()) {
    absl::StatusOr<std::vector<int64_t>> sizes = ParseByteSizeList(device_memory);
    if (!sizes.ok())
      return absl::InvalidArgumentError(absl::StrCat("flag --device-memory: ", sizes.status().message()));
    request.mutable_topology()->mutable_device_memory_bytes()->Add(sizes->begin(), sizes->end());
  }
  return request;
}

}  // namespace muonshard::cli
