// A safetensors file from outside, as every reader of the format sees it:
// the common codec (common/safetensors_header.h), the checkpoint loader's
// reading of a rank file (checkpoint/safetensors.h: corrupt = DATA_LOSS) and
// `muonshardctl import-safetensors` of a single file. The input is the file:
// 8-byte length, JSON header, data.
//
// Checked on headers that parse: every entry lies inside the data the header
// claims; the codec's own encoding of the parsed entries parses back to the
// same entries and metadata, 8-byte aligned; the checkpoint's view lists
// entries in ascending offset; an import names only tensors of the header.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "common/safetensors_header.h"
#include "fuzz/fuzz_util.h"
#include "importer/manifest_summary.h"
#include "importer/safetensors_import.h"

namespace muonshard::fuzz {
namespace {

bool SameEntry(const SafetensorsEntry& a, const SafetensorsEntry& b) {
  return a.key == b.key && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin && a.end == b.end;
}

void CheckHeader(const SafetensorsHeader& h) {
  for (const SafetensorsEntry& e : h.entries) {
    FUZZ_CHECK(0 <= e.begin && e.begin <= e.end && e.end <= h.data_size,
               absl::StrCat("entry ", e.key, " outside the data"));
  }
  const std::string encoded = EncodeSafetensorsHeader(h.entries, h.metadata);
  FUZZ_CHECK(encoded.size() % 8 == 0, "encoded header not 8-byte aligned");
  auto n = SafetensorsHeaderLength(absl::string_view(encoded).substr(0, 8), static_cast<int64_t>(encoded.size()));
  FUZZ_CHECK(n.ok(), n.status().ToString());
  auto again = ParseSafetensorsHeader(absl::string_view(encoded).substr(8));
  FUZZ_CHECK(again.ok(), absl::StrCat("re-encoded header does not parse: ", again.status().ToString()));
  FUZZ_CHECK(again->entries.size() == h.entries.size() && again->metadata == h.metadata, "re-encoded header differs");
  for (size_t i = 0; i < h.entries.size(); ++i) {
    FUZZ_CHECK(SameEntry(again->entries[i], h.entries[i]), absl::StrCat("re-encoded entry ", i, " differs"));
  }
}

}  // namespace
}  // namespace muonshard::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muonshard;  // NOLINT: a fuzz entry point
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  const int64_t file_size = static_cast<int64_t>(size);

  auto n = SafetensorsHeaderLength(file.substr(0, 8), file_size);
  auto ckpt_n = checkpoint::SafetensorsHeaderLength(file.substr(0, 8), file_size);
  FUZZ_CHECK(n.ok() == ckpt_n.ok(), "the checkpoint and the codec disagree on the header length");
  if (!n.ok()) return 0;
  const absl::string_view json = file.substr(8, static_cast<size_t>(*n));

  auto header = ParseSafetensorsHeader(json);
  if (header.ok()) {
    fuzz::CheckHeader(*header);
    (void)CheckSafetensorsDataSize(*header, file_size);
  }

  auto ckpt = checkpoint::ParseSafetensorsHeader(json, file_size);
  if (ckpt.ok()) {
    FUZZ_CHECK(header.ok(), "the checkpoint accepts a header the codec rejects");
    for (size_t i = 1; i < ckpt->entries.size(); ++i) {
      FUZZ_CHECK(ckpt->entries[i - 1].end <= ckpt->entries[i].begin, "checkpoint entries not in offset order");
    }
  }

  for (bool skip : {false, true}) {
    importer::SafetensorsFileHeader f;
    f.name = "model.safetensors";
    f.file_size = file_size;
    f.json = std::string(json);
    importer::SafetensorsImportOptions options;
    options.skip_unsupported = skip;
    auto imported = importer::ImportSafetensorsHeaders({f}, nullptr, options);
    if (!imported.ok()) continue;
    FUZZ_CHECK(header.ok(), "the importer accepts a header the codec rejects");
    FUZZ_CHECK(imported->manifest.tensors_size() + static_cast<int>(imported->skipped.size()) ==
                   static_cast<int>(header->entries.size()),
               "imported + skipped != the header's entries");
    importer::FormatSummaryTable(imported->manifest);
  }
  return 0;
}
