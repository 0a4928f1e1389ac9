// model.safetensors.index.json from outside (`muonshardctl
// import-safetensors DIR`, the sharded HF format): ParseSafetensorsIndex,
// then the import of the shards it names, with headers made to agree with
// it (one F32 [1] tensor per entry), so the import's matching of index and
// headers runs on every index that parses.
//
// Checked: an accepted import lists the index's tensors in the index's
// order, each file's tensors are the index's, and every file is named once.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors_header.h"
#include "fuzz/fuzz_util.h"
#include "importer/safetensors_import.h"

namespace {
// Indexes naming more tensors are parsed but not imported (headers are
// built for each).
constexpr size_t kMaxTensorsToImport = 4096;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muonshard;  // NOLINT: a fuzz entry point
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  auto index = importer::ParseSafetensorsIndex(json, "model.safetensors.index.json");
  if (!index.ok()) return 0;
  absl::flat_hash_set<std::string> files(index->files.begin(), index->files.end());
  FUZZ_CHECK(files.size() == index->files.size(), "a file listed twice");
  for (const auto& [tensor, file] : index->weight_map) {
    FUZZ_CHECK(files.contains(file), absl::StrCat("tensor ", tensor, "'s file is not in files"));
  }
  if (index->weight_map.size() > kMaxTensorsToImport) return 0;

  absl::flat_hash_map<std::string, std::vector<SafetensorsEntry>> entries;
  for (const auto& [tensor, file] : index->weight_map) {
    std::vector<SafetensorsEntry>& e = entries[file];
    const int64_t begin = e.empty() ? 0 : e.back().end;
    e.push_back(SafetensorsEntry{tensor, "F32", {1}, begin, begin + 4});
  }
  std::vector<importer::SafetensorsFileHeader> headers;
  for (const std::string& name : index->files) {
    const std::vector<SafetensorsEntry>& e = entries[name];
    const std::string encoded = EncodeSafetensorsHeader(e, {});
    importer::SafetensorsFileHeader h;
    h.name = name;
    h.json = encoded.substr(8);
    h.file_size = static_cast<int64_t>(encoded.size()) + (e.empty() ? 0 : e.back().end);
    headers.push_back(std::move(h));
  }
  auto imported = importer::ImportSafetensorsHeaders(headers, &*index, importer::SafetensorsImportOptions());
  if (!imported.ok()) return 0;
  FUZZ_CHECK(imported->manifest.tensors_size() == static_cast<int>(index->weight_map.size()),
             "the import lost or added tensors");
  for (int i = 0; i < imported->manifest.tensors_size(); ++i) {
    FUZZ_CHECK(imported->manifest.tensors(i).name() == index->weight_map[i].first,
               absl::StrCat("tensor ", i, " out of the index's order"));
  }
  return 0;
}
