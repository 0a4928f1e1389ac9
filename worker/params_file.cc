#include "worker/params_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/safetensors.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace muonshard::worker {
namespace {

constexpr char kF32[] = "F32";

// Metadata that identifies a run: two dumps to compare must agree on these
// when both carry them.
constexpr const char* kRunMetadata[] = {"model",    "content_hash", "plan_version", "steps",
                                        "workload", "seed",         "lr",           "weight_decay"};

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status CheckTensors(const ParamsFile& file) {
  std::set<std::string> names;
  for (const ParamTensor& t : file.tensors) {
    if (t.name.empty()) return absl::InvalidArgumentError("params: a tensor has an empty name");
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("params: tensor \"", t.name, "\" appears twice"));
    }
    for (int64_t d : t.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("params: tensor \"", t.name, "\": negative dim"));
    }
    if (Product(t.shape) != static_cast<int64_t>(t.values.size())) {
      return absl::InvalidArgumentError(absl::StrCat("params: tensor \"", t.name, "\" has ", t.values.size(),
                                                     " values for shape [", absl::StrJoin(t.shape, ", "), "]"));
    }
  }
  return absl::OkStatus();
}

TensorComparison Compare(const ParamTensor& a, const ParamTensor& e, double rtol) {
  TensorComparison c;
  c.name = e.name;
  c.numel = static_cast<int64_t>(e.values.size());
  // memcmp/memcpy of an empty vector's null data() is undefined (UBSan).
  c.bit_identical =
      e.values.empty() || std::memcmp(a.values.data(), e.values.data(), e.values.size() * sizeof(float)) == 0;
  bool finite = true;
  for (size_t i = 0; i < e.values.size(); ++i) {
    const double x = a.values[i];
    const double y = e.values[i];
    finite = finite && std::isfinite(x) && std::isfinite(y);
    c.max_abs = std::max(c.max_abs, std::abs(x - y));
    c.scale = std::max(c.scale, std::abs(y));
  }
  c.rel = c.max_abs == 0 ? 0 : (c.scale > 0 ? c.max_abs / c.scale : INFINITY);
  c.ok = c.bit_identical || (finite && c.rel <= rtol);
  return c;
}

}  // namespace

const ParamTensor* ParamsFile::Find(const std::string& name) const {
  for (const ParamTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::Status WriteParamsFile(const std::string& path, const ParamsFile& file) {
  MUONSHARD_RETURN_IF_ERROR(CheckTensors(file));
  std::vector<checkpoint::SafetensorsEntry> entries;
  int64_t offset = 0;
  for (const ParamTensor& t : file.tensors) {
    const int64_t bytes = static_cast<int64_t>(t.values.size() * sizeof(float));
    entries.push_back({t.name, kF32, t.shape, offset, offset + bytes});
    offset += bytes;
  }
  std::string out = checkpoint::EncodeSafetensorsHeader(entries, file.metadata);
  out.reserve(out.size() + offset);
  // safetensors data is little-endian, as are the hosts this builds for.
  for (const ParamTensor& t : file.tensors) {
    out.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
  }
  return Annotate(WriteFileAtomic(path, out), absl::StrCat("writing parameters to ", path));
}

absl::StatusOr<ParamsFile> ReadParamsFile(const std::string& path) {
  MUONSHARD_ASSIGN_OR_RETURN(const std::string content, ReadFile(path));
  const int64_t size = static_cast<int64_t>(content.size());
  if (size < 8) return absl::DataLossError(absl::StrCat(path, ": too short for safetensors"));
  absl::StatusOr<int64_t> header_length = checkpoint::SafetensorsHeaderLength(content.substr(0, 8), size);
  if (!header_length.ok()) return Annotate(header_length.status(), path);
  absl::StatusOr<checkpoint::SafetensorsHeader> header =
      checkpoint::ParseSafetensorsHeader(absl::string_view(content).substr(8, *header_length), size);
  if (!header.ok()) return Annotate(header.status(), path);
  ParamsFile file;
  file.metadata = header->metadata;
  for (const checkpoint::SafetensorsEntry& e : header->entries) {
    if (e.dtype != kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor \"", e.key, "\" is ", e.dtype, "; parameter dumps hold F32 only"));
    }
    ParamTensor t{e.key, e.shape, std::vector<float>((e.end - e.begin) / sizeof(float))};
    if (!t.values.empty()) std::memcpy(t.values.data(), content.data() + header->data_start + e.begin, e.end - e.begin);
    file.tensors.push_back(std::move(t));
  }
  return file;
}

bool ParamsComparison::ok() const { return mismatches.empty() && failed() == 0; }

int ParamsComparison::failed() const {
  return static_cast<int>(
      std::count_if(tensors.begin(), tensors.end(), [](const TensorComparison& t) { return !t.ok; }));
}

bool ParamsComparison::bit_identical() const {
  return mismatches.empty() &&
         std::all_of(tensors.begin(), tensors.end(), [](const TensorComparison& t) { return t.bit_identical; });
}

const TensorComparison* ParamsComparison::worst() const {
  auto it = std::max_element(tensors.begin(), tensors.end(),
                             [](const TensorComparison& a, const TensorComparison& b) { return a.rel < b.rel; });
  return it == tensors.end() ? nullptr : &*it;
}

ParamsComparison CompareParams(const ParamsFile& actual, const ParamsFile& expected, double rtol) {
  ParamsComparison out;
  out.rtol = rtol;
  for (const ParamTensor& e : expected.tensors) {
    const ParamTensor* a = actual.Find(e.name);
    if (a == nullptr) {
      out.mismatches.push_back(absl::StrCat("tensor \"", e.name, "\" is missing from the first file"));
    } else if (a->shape != e.shape) {
      out.mismatches.push_back(absl::StrCat("tensor \"", e.name, "\": shape [", absl::StrJoin(a->shape, ", "), "] vs [",
                                            absl::StrJoin(e.shape, ", "), "]"));
    } else {
      out.tensors.push_back(Compare(*a, e, rtol));
    }
  }
  for (const ParamTensor& a : actual.tensors) {
    if (expected.Find(a.name) == nullptr) {
      out.mismatches.push_back(absl::StrCat("tensor \"", a.name, "\" is missing from the second file"));
    }
  }
  for (const char* key : kRunMetadata) {
    auto a = actual.metadata.find(key);
    auto e = expected.metadata.find(key);
    if (a != actual.metadata.end() && e != expected.metadata.end() && a->second != e->second) {
      out.mismatches.push_back(
          absl::StrCat("metadata \"", key, "\" differs: ", a->second, " vs ", e->second, " (different runs)"));
    }
  }
  return out;
}

}  // namespace muonshard::worker
