#include "importer/safetensors_import.h"

#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/ordered_json.h"
#include "common/safetensors_header.h"
#include "common/status_macros.h"
#include "importer/ns_blocks_rules.h"

namespace muonshard::importer {
namespace {

// Tensor names may be long; show more of them than of other input.
constexpr size_t kMaxQuotedName = 160;
// `expert` is an int32.
constexpr int64_t kMaxExpert = 2147483647;
// Longest file name Linux takes.
constexpr size_t kMaxFileName = 255;

std::string Tensor(absl::string_view name) { return absl::StrCat("tensor ", QuoteForMessage(name, kMaxQuotedName)); }

absl::Status Invalid(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// A bare file name beside the index: nothing that leaves the directory or
// would garble a message.
bool IsBareFileName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxFileName || name == "." || name == "..") return false;
  for (char c : name) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '/' || c == '\\' || u < 0x20 || u == 0x7F) return false;
  }
  return true;
}

std::optional<v1::DType> ManifestDType(absl::string_view dtype) {
  if (dtype == "BF16") return v1::BF16;
  if (dtype == "F16") return v1::FP16;
  if (dtype == "F32") return v1::FP32;
  return std::nullopt;
}

// A file's parsed header and the name messages give it.
struct ParsedFile {
  const SafetensorsFileHeader* source = nullptr;
  std::string shown;
  SafetensorsHeader header;
};

// Where a tensor lives: files[file].header.entries[entry].
struct Location {
  int file = 0;
  int entry = 0;
};

absl::StatusOr<ParsedFile> ParseFile(const SafetensorsFileHeader& source, SafetensorsImport* out) {
  ParsedFile parsed;
  parsed.source = &source;
  parsed.shown = source.path.empty() ? source.name : source.path;
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(source.json);
  if (!header.ok()) return Annotate(header.status(), parsed.shown);
  parsed.header = *std::move(header);
  const int64_t available = source.file_size - parsed.header.data_start;
  if (available >= 0 && parsed.header.data_size > available) {
    out->short_files.push_back(parsed.shown);  // header-only or truncated: the data is not read
  } else {
    MUONSHARD_RETURN_IF_ERROR(Annotate(CheckSafetensorsDataSize(parsed.header, source.file_size), parsed.shown));
  }
  ++out->files;
  out->bytes_read += parsed.header.data_start;
  return parsed;
}

// Every tensor of every file, once across the files.
absl::StatusOr<absl::flat_hash_map<absl::string_view, Location>> LocateTensors(const std::vector<ParsedFile>& files) {
  absl::flat_hash_map<absl::string_view, Location> where;
  for (int f = 0; f < static_cast<int>(files.size()); ++f) {
    const std::vector<SafetensorsEntry>& entries = files[f].header.entries;
    for (int e = 0; e < static_cast<int>(entries.size()); ++e) {
      auto [it, inserted] = where.try_emplace(entries[e].key, Location{f, e});
      if (!inserted) {
        return Invalid(files[f].shown,
                       absl::StrCat(Tensor(entries[e].key), " is also in ", files[it->second.file].shown));
      }
    }
  }
  return where;
}

// Appends `entry` to the manifest, or skips it (skip_unsupported).
absl::Status AddTensor(const SafetensorsEntry& entry, const std::string& shown, const SafetensorsImportOptions& options,
                       SafetensorsImport* out) {
  std::optional<v1::DType> dtype = ManifestDType(entry.dtype);
  if (!dtype.has_value()) {
    if (options.skip_unsupported) {
      out->skipped.push_back({entry.key, entry.dtype, shown});
      return absl::OkStatus();
    }
    return Invalid(shown, absl::StrCat(Tensor(entry.key), ": dtype ", entry.dtype,
                                       " is not supported (BF16, F16 and F32 are; skip_unsupported / "
                                       "--skip-unsupported leaves such tensors out)"));
  }
  v1::TensorSpec* t = out->manifest.add_tensors();
  t->set_name(entry.key);
  for (int64_t d : entry.shape) t->add_shape(d);
  t->set_dtype(*dtype);
  const int expert = ExpertIndexFromName(entry.key);
  if (expert >= 0) t->set_expert(expert);
  return absl::OkStatus();
}

absl::Status AddInFileOrder(const std::vector<ParsedFile>& files, const SafetensorsImportOptions& options,
                            SafetensorsImport* out) {
  for (const ParsedFile& file : files) {
    for (const SafetensorsEntry& entry : file.header.entries) {
      MUONSHARD_RETURN_IF_ERROR(AddTensor(entry, file.shown, options, out));
    }
  }
  return absl::OkStatus();
}

// The first tensor of `files` that the index does not list.
absl::Status CheckAllListed(const std::vector<ParsedFile>& files, const SafetensorsIndex& index) {
  absl::flat_hash_set<absl::string_view> listed;
  listed.reserve(index.weight_map.size());
  for (const auto& [tensor, file] : index.weight_map) listed.insert(tensor);
  for (const ParsedFile& file : files) {
    for (const SafetensorsEntry& entry : file.header.entries) {
      if (!listed.contains(entry.key)) {
        return Invalid(file.shown,
                       absl::StrCat("holds ", Tensor(entry.key), ", which the index's weight_map does not list"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status AddInIndexOrder(const std::vector<ParsedFile>& files, const SafetensorsIndex& index,
                             const SafetensorsImportOptions& options, SafetensorsImport* out) {
  absl::flat_hash_map<absl::string_view, int> file_by_name;
  for (int f = 0; f < static_cast<int>(files.size()); ++f) file_by_name.try_emplace(files[f].source->name, f);
  for (const std::string& name : index.files) {
    if (!file_by_name.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("no header given for ", QuoteForMessage(name), ", which the index names"));
    }
  }
  MUONSHARD_ASSIGN_OR_RETURN(auto where, LocateTensors(files));
  for (const auto& [tensor, name] : index.weight_map) {
    const ParsedFile& named = files[file_by_name.at(name)];
    auto it = where.find(tensor);
    if (it == where.end() || it->second.file != file_by_name.at(name)) {
      const std::string elsewhere =
          it == where.end() ? "" : absl::StrCat(" (it is in ", files[it->second.file].shown, ")");
      return Invalid(named.shown,
                     absl::StrCat("holds no ", Tensor(tensor), ", which the index places there", elsewhere));
    }
    MUONSHARD_RETURN_IF_ERROR(AddTensor(named.header.entries[it->second.entry], named.shown, options, out));
  }
  return CheckAllListed(files, index);
}

// The index's non-empty "weight_map" object.
absl::StatusOr<const JsonValue*> FindWeightMap(const JsonValue& root, absl::string_view index_name) {
  if (!root.is_object()) {
    return Invalid(index_name, absl::StrCat("not a JSON object: it is ", JsonValue::KindName(root.kind())));
  }
  const JsonValue* map = root.Find("weight_map");
  if (map == nullptr) return Invalid(index_name, "no \"weight_map\"");
  if (!map->is_object()) {
    return Invalid(index_name, absl::StrCat("\"weight_map\" is ", JsonValue::KindName(map->kind()), ", not an object"));
  }
  if (map->members().empty()) return Invalid(index_name, "\"weight_map\" is empty");
  return map;
}

// One weight_map entry: a tensor name -> a bare file name.
absl::Status CheckFileEntry(const JsonMember& m, absl::string_view index_name) {
  if (!m.value.is_string()) {
    return Invalid(index_name, absl::StrCat("weight_map: ", Tensor(m.key), " maps to ",
                                            JsonValue::KindName(m.value.kind()), ", not a file name"));
  }
  if (!IsBareFileName(m.value.text())) {
    return Invalid(index_name, absl::StrCat("weight_map: ", Tensor(m.key), " maps to ", QuoteForMessage(m.value.text()),
                                            ", not a file name beside the index"));
  }
  return absl::OkStatus();
}

std::string ModelName(const SafetensorsImportOptions& options) {
  if (!options.name.empty()) return options.name;
  if (!options.default_name.empty()) return options.default_name;
  return "model";
}

}  // namespace

absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view json, absl::string_view index_name) {
  absl::StatusOr<JsonValue> root = ParseJson(json);
  if (!root.ok()) return Invalid(index_name, absl::StrCat("not a JSON object: ", root.status().message()));
  MUONSHARD_ASSIGN_OR_RETURN(const JsonValue* map, FindWeightMap(*root, index_name));
  SafetensorsIndex index;
  index.weight_map.reserve(map->members().size());
  absl::flat_hash_set<absl::string_view> seen_files;
  for (const JsonMember& m : map->members()) {
    MUONSHARD_RETURN_IF_ERROR(CheckFileEntry(m, index_name));
    index.weight_map.emplace_back(m.key, m.value.text());
  }
  for (const auto& [tensor, file] : index.weight_map) {
    if (seen_files.insert(file).second) index.files.push_back(file);
  }
  return index;
}

absl::StatusOr<SafetensorsImport> ImportSafetensorsHeaders(const std::vector<SafetensorsFileHeader>& files,
                                                           const SafetensorsIndex* index,
                                                           const SafetensorsImportOptions& options) {
  SafetensorsImport out;
  std::vector<ParsedFile> parsed;
  parsed.reserve(files.size());
  for (const SafetensorsFileHeader& file : files) {
    MUONSHARD_ASSIGN_OR_RETURN(ParsedFile p, ParseFile(file, &out));
    parsed.push_back(std::move(p));
  }
  out.manifest.set_model(ModelName(options));
  if (index != nullptr) {
    MUONSHARD_RETURN_IF_ERROR(AddInIndexOrder(parsed, *index, options, &out));
  } else {
    MUONSHARD_RETURN_IF_ERROR(LocateTensors(parsed).status());
    MUONSHARD_RETURN_IF_ERROR(AddInFileOrder(parsed, options, &out));
  }
  if (out.manifest.tensors_size() == 0) {
    const std::string where = parsed.empty() ? std::string("safetensors import") : parsed.front().shown;
    return Invalid(where, out.skipped.empty()
                              ? std::string("holds no tensors")
                              : absl::StrCat("holds no BF16, F16 or F32 tensors (", out.skipped.size(), " skipped)"));
  }
  MUONSHARD_RETURN_IF_ERROR(ApplyNsBlocksRules(options.ns_blocks, &out.manifest));
  return out;
}

int ExpertIndexFromName(absl::string_view name) {
  // As plan/model.cc's IndexAfter(name, "experts."), which
  // the planner checks `expert` against.
  constexpr absl::string_view kToken = "experts.";
  size_t pos = 0;
  while ((pos = name.find(kToken, pos)) != absl::string_view::npos) {
    const bool boundary = pos == 0 || name[pos - 1] == '.';
    size_t i = pos + kToken.size();
    if (boundary && i < name.size() && absl::ascii_isdigit(name[i])) {
      int64_t v = 0;
      while (i < name.size() && absl::ascii_isdigit(name[i]) && v < (1 << 30)) {
        v = v * 10 + (name[i] - '0');
        ++i;
      }
      // Past int32 the planner's reading wraps; leave such an index to it.
      if (i == name.size() || name[i] == '.') return v <= kMaxExpert ? static_cast<int>(v) : -1;
    }
    pos += kToken.size();
  }
  return -1;
}

}  // namespace muonshard::importer
