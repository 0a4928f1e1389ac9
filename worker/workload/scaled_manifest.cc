#include "worker/workload/scaled_manifest.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace muonshard::worker {
namespace {

// N of the first "layers.N" component that starts the name or follows a '.';
// -1 if there is none.
int LayerIndex(absl::string_view name) {
  constexpr absl::string_view kToken = "layers.";
  for (size_t pos = name.find(kToken); pos != absl::string_view::npos; pos = name.find(kToken, pos + 1)) {
    if (pos != 0 && name[pos - 1] != '.') continue;
    size_t i = pos + kToken.size();
    int value = 0;
    bool digits = false;
    while (i < name.size() && absl::ascii_isdigit(name[i]) && value < (1 << 24)) {
      value = value * 10 + (name[i++] - '0');
      digits = true;
    }
    if (digits && (i == name.size() || name[i] == '.')) return value;
  }
  return -1;
}

// A fused expert stack: 3-D with "experts." followed by a non-index.
bool IsExpertStack(const v1::TensorSpec& t) {
  if (t.shape_size() != 3) return false;
  const size_t pos = t.name().find("experts.");
  return pos != std::string::npos && pos + 8 < t.name().size() && !absl::ascii_isdigit(t.name()[pos + 8]);
}

}  // namespace

absl::StatusOr<v1::ModelManifest> ScaleDownManifest(const v1::ModelManifest& manifest,
                                                    const ScaleDownOptions& options) {
  if (options.divisor < 1) {
    return absl::InvalidArgumentError(absl::StrCat("scale-down divisor must be >= 1, got ", options.divisor));
  }
  if (options.max_layers == 0 || options.max_layers < -1) {
    return absl::InvalidArgumentError(absl::StrCat("max_layers must be -1 or >= 1, got ", options.max_layers));
  }
  v1::ModelManifest out;
  out.set_model(options.divisor == 1 ? manifest.model() : absl::StrCat(manifest.model(), "/", options.divisor));
  for (const v1::TensorSpec& t : manifest.tensors()) {
    const int layer = LayerIndex(t.name());
    if (options.max_layers > 0 && layer >= options.max_layers) continue;
    v1::TensorSpec* s = out.add_tensors();
    *s = t;
    const bool stack = IsExpertStack(t);
    for (int d = 0; d < s->shape_size(); ++d) {
      if (stack && d == 0) continue;
      s->set_shape(d, std::max<int64_t>(1, t.shape(d) / options.divisor));
    }
  }
  return out;
}

}  // namespace muonshard::worker
