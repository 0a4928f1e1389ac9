// HuggingFace config.json -> manifest: `muonshardctl import-hf` and the
// Python package's import. The input is the config file's bytes; the MTP
// option is tried both ways (most configs reject it: that is a status too).
// What import-hf then does with an accepted manifest runs too: the summary
// (parameter totals, which must not overflow) and the JSON it prints (for
// manifests of up to 4096 tensors). Configs asking for more than 2^14
// layer x expert blocks are skipped (see Huge below).

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/proto_json.h"
#include "fuzz/fuzz_util.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "importer/hf_import.h"
#include "importer/manifest_summary.h"

namespace {
// Printing a manifest of a huge model (a config may ask for thousands of
// layers) takes long and tests protobuf, not the importer.
constexpr int kMaxTensorsToPrint = 4096;

// The importer accepts up to 2^20 expert MLPs (layers x experts): a config
// of a few hundred bytes may ask for a manifest of ~3 million tensors, which
// takes seconds and ~1 GB (more under ASan) by design. The harness skips
// configs asking for more than this many layer x expert blocks, so that an
// execution stays short; the importer's own bound is tested by its unit
// tests.
constexpr double kMaxBlocks = 1 << 14;

bool Huge(absl::string_view config) {
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(google::protobuf::StringPiece(config.data(), config.size()), &root)
           .ok()) {
    return false;
  }
  auto number = [&root](const char* key) {
    auto it = root.fields().find(key);
    return it != root.fields().end() && it->second.has_number_value() ? it->second.number_value() : 0.0;
  };
  double experts = 1;
  for (const char* key : {"n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts"}) {
    experts = std::max(experts, number(key));
  }
  return std::max(1.0, number("num_hidden_layers")) * experts > kMaxBlocks;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  muonshard::fuzz::SilenceProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muonshard;  // NOLINT: a fuzz entry point
  const absl::string_view config(reinterpret_cast<const char*>(data), size);
  if (Huge(config)) return 0;
  for (bool mtp : {false, true}) {
    importer::ImportOptions options;
    options.mtp = mtp;
    options.default_name = "fuzz";
    auto manifest = importer::ImportHfConfig(config, options);
    if (!manifest.ok()) continue;
    FUZZ_CHECK(manifest->tensors_size() > 0, "an imported manifest without tensors");
    importer::FormatSummaryTable(*manifest);
    if (manifest->tensors_size() > kMaxTensorsToPrint) continue;
    auto json = ToJson(*manifest);
    FUZZ_CHECK(json.ok(), json.status().ToString());
  }
  return 0;
}
