// muonshard-scale-manifest --manifest M.json [--divisor 16] [--layers 2]:
// prints the manifest shrunk by ScaleDownManifest (worker/workload/
// scaled_manifest.h) as proto3 JSON, so process-level benchmarks
// (process_bench.sh) can submit a scaled-down real model to a coordinator.
// Exit 0 ok, 1 on an unreadable file, 2 on bad usage or input.
#include <iostream>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/flags.h"
#include "common/proto_json.h"
#include "common/version.h"
#include "worker/workload/scaled_manifest.h"

namespace muonshard::worker {
namespace {

int Main(int argc, char** argv) {
  FlagSet flags("usage: muonshard-scale-manifest --manifest M.json [--divisor 16] [--layers 2]");
  std::string path;
  ScaleDownOptions options;
  options.divisor = 16;
  options.max_layers = 2;
  flags.String("manifest", &path, "model manifest (proto3 JSON)");
  flags.Int("divisor", &options.divisor, "every dimension is divided by this (expert counts kept)");
  flags.Int("layers", &options.max_layers, "keep the first this many layers (-1: all)");
  absl::StatusOr<std::vector<std::string>> positional = flags.Parse(ArgsOf(argc, argv));
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (flags.version_requested()) {
    std::cout << VersionLine("muonshard-scale-manifest") << "\n";
    return 0;
  }
  if (!positional.ok() || !positional->empty() || path.empty()) {
    std::cerr << "error: " << (positional.ok() ? "flag --manifest is required" : positional.status().message())
              << "\n\n"
              << flags.Usage();
    return 2;
  }
  absl::StatusOr<std::string> json = ReadFile(path);
  if (!json.ok()) {
    std::cerr << "error: " << json.status().message() << "\n";
    return 1;
  }
  v1::ModelManifest manifest;
  absl::Status s = FromJson(*json, &manifest, path);
  absl::StatusOr<v1::ModelManifest> scaled = s.ok() ? ScaleDownManifest(manifest, options) : s;
  absl::StatusOr<std::string> out = scaled.ok() ? ToJson(*scaled) : scaled.status();
  if (!out.ok()) {
    std::cerr << "error: " << out.status().message() << "\n";
    return 2;
  }
  std::cout << *out << "\n";
  return 0;
}

}  // namespace
}  // namespace muonshard::worker

int main(int argc, char** argv) { return muonshard::worker::Main(argc, argv); }
