#include "sim/cluster_json.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ordered_json.h"
#include "common/status_macros.h"

namespace muonshard::sim {
namespace {

absl::Status WrongType(const std::string& field, const char* wanted, const JsonValue& v) {
  return absl::InvalidArgumentError(
      absl::StrCat("cluster.", field, ": must be ", wanted, ", got ", JsonValue::KindName(v.kind())));
}

absl::StatusOr<double> Number(const JsonValue& v, const std::string& field) {
  double d = 0;
  if (v.kind() != JsonValue::Kind::kNumber || !absl::SimpleAtod(v.text(), &d)) {
    return WrongType(field, "a number", v);
  }
  return d;
}

absl::StatusOr<int> Integer(const JsonValue& v, const std::string& field) {
  const std::optional<int64_t> i = v.kind() == JsonValue::Kind::kNumber ? v.AsInt64() : std::nullopt;
  if (!i.has_value() || *i < std::numeric_limits<int>::min() || *i > std::numeric_limits<int>::max()) {
    return WrongType(field, "an integer", v);
  }
  return static_cast<int>(*i);
}

absl::StatusOr<std::string> String(const JsonValue& v, const std::string& field) {
  if (!v.is_string()) return WrongType(field, "a string", v);
  return v.text();
}

absl::Status UnknownField(const std::string& field, const std::vector<std::string>& known) {
  return absl::InvalidArgumentError(
      absl::StrCat("cluster.", field, ": unknown field (known: ", absl::StrJoin(known, ", "), ")"));
}

absl::Status ApplyLink(const JsonValue& v, const std::string& field, LinkSpec& link) {
  if (!v.is_object()) return WrongType(field, "an object", v);
  for (const JsonMember& m : v.members()) {
    const std::string name = absl::StrCat(field, ".", m.key);
    double* target = m.key == "bandwidth_gb_s" ? &link.bandwidth_gb_s
                     : m.key == "efficiency"   ? &link.efficiency
                     : m.key == "latency_us"   ? &link.latency_us
                                               : nullptr;
    if (target == nullptr) return UnknownField(name, {"bandwidth_gb_s", "efficiency", "latency_us"});
    MUONSHARD_ASSIGN_OR_RETURN(*target, Number(m.value, name));
  }
  return absl::OkStatus();
}

absl::Status ApplyNsTable(const JsonValue& v, std::vector<NsEfficiencyPoint>& table) {
  if (!v.is_array()) return WrongType("ns_efficiency", "an array", v);
  table.clear();
  for (size_t i = 0; i < v.elements().size(); ++i) {
    const JsonValue& e = v.elements()[i];
    const std::string field = absl::StrCat("ns_efficiency[", i, "]");
    if (!e.is_object()) return WrongType(field, "an object", e);
    NsEfficiencyPoint point;
    for (const JsonMember& m : e.members()) {
      const std::string name = absl::StrCat(field, ".", m.key);
      if (m.key == "min_dim") {
        MUONSHARD_ASSIGN_OR_RETURN(const int d, Integer(m.value, name));
        point.min_dim = d;
      } else if (m.key == "efficiency") {
        MUONSHARD_ASSIGN_OR_RETURN(point.efficiency, Number(m.value, name));
      } else {
        return UnknownField(name, {"min_dim", "efficiency"});
      }
    }
    table.push_back(point);
  }
  return absl::OkStatus();
}

absl::Status ApplyNsBatch(const JsonValue& v, NsBatchPoint& point) {
  if (!v.is_object()) return WrongType("ns_batched", "an object", v);
  point = {};
  for (const JsonMember& m : v.members()) {
    const std::string name = absl::StrCat("ns_batched.", m.key);
    if (m.key == "matrices" || m.key == "min_dim") {
      MUONSHARD_ASSIGN_OR_RETURN(const int n, Integer(m.value, name));
      (m.key == "matrices" ? point.matrices : point.min_dim) = n;
    } else if (m.key == "efficiency") {
      MUONSHARD_ASSIGN_OR_RETURN(point.efficiency, Number(m.value, name));
    } else {
      return UnknownField(name, {"matrices", "min_dim", "efficiency"});
    }
  }
  return absl::OkStatus();
}

double* NumberField(ClusterSpec& c, const std::string& key) {
  if (key == "collective_base_us") return &c.collective_base_us;
  if (key == "gemm_tflops") return &c.gemm_tflops;
  if (key == "ns_call_us") return &c.ns_call_us;
  if (key == "hbm_gb_s") return &c.hbm_gb_s;
  if (key == "hbm_efficiency") return &c.hbm_efficiency;
  if (key == "adamw_efficiency") return &c.adamw_efficiency;
  if (key == "kernel_launch_us") return &c.kernel_launch_us;
  if (key == "host_collective_gb_s") return &c.host_collective_gb_s;
  return nullptr;
}

const std::vector<std::string>& KnownFields() {
  static const auto* const kFields = new std::vector<std::string>{"preset",
                                                                  "name",
                                                                  "gpus_per_node",
                                                                  "nodes",
                                                                  "intra_node",
                                                                  "inter_node",
                                                                  "collective_library",
                                                                  "algorithm",
                                                                  "nvls",
                                                                  "inter_node_shared",
                                                                  "collective_base_us",
                                                                  "gemm_tflops",
                                                                  "ns_efficiency",
                                                                  "ns_batched",
                                                                  "ns_call_us",
                                                                  "hbm_gb_s",
                                                                  "hbm_efficiency",
                                                                  "adamw_efficiency",
                                                                  "kernel_launch_us",
                                                                  "host_collective_gb_s"};
  return *kFields;
}

absl::Status ApplyChoice(const JsonMember& m, ClusterSpec& c) {
  MUONSHARD_ASSIGN_OR_RETURN(const std::string s, String(m.value, m.key));
  if (m.key == "name") {
    c.name = s;
    return absl::OkStatus();
  }
  if (m.key == "collective_library") {
    absl::StatusOr<CollectiveLibrary> library = ParseLibrary(s);
    if (!library.ok())
      return absl::InvalidArgumentError(absl::StrCat("cluster.", m.key, ": ", library.status().message()));
    c.library = *library;
    return absl::OkStatus();
  }
  absl::StatusOr<Algorithm> algorithm = ParseAlgorithm(s);
  if (!algorithm.ok())
    return absl::InvalidArgumentError(absl::StrCat("cluster.", m.key, ": ", algorithm.status().message()));
  c.algorithm = *algorithm;
  return absl::OkStatus();
}

absl::Status ApplyField(const JsonMember& m, ClusterSpec& c) {
  const std::string& key = m.key;
  if (key == "preset") return absl::OkStatus();  // applied first
  if (double* target = NumberField(c, key)) {
    MUONSHARD_ASSIGN_OR_RETURN(*target, Number(m.value, key));
    return absl::OkStatus();
  }
  if (key == "gpus_per_node" || key == "nodes") {
    MUONSHARD_ASSIGN_OR_RETURN((key == "nodes" ? c.nodes : c.gpus_per_node), Integer(m.value, key));
    return absl::OkStatus();
  }
  if (key == "intra_node") return ApplyLink(m.value, key, c.intra_node);
  if (key == "inter_node") return ApplyLink(m.value, key, c.inter_node);
  if (key == "ns_efficiency") return ApplyNsTable(m.value, c.ns_efficiency);
  if (key == "ns_batched") return ApplyNsBatch(m.value, c.ns_batched);
  if (key == "nvls" || key == "inter_node_shared") {
    if (m.value.kind() != JsonValue::Kind::kBool) return WrongType(key, "a boolean", m.value);
    (key == "nvls" ? c.nvls : c.inter_node_shared) = m.value.bool_value();
    return absl::OkStatus();
  }
  if (key == "name" || key == "collective_library" || key == "algorithm") return ApplyChoice(m, c);
  return UnknownField(key, KnownFields());
}

}  // namespace

absl::StatusOr<ClusterSpec> ParseClusterJson(absl::string_view text) {
  absl::StatusOr<JsonValue> doc = ParseJson(text);
  if (!doc.ok()) return absl::InvalidArgumentError(absl::StrCat("cluster: ", doc.status().message()));
  if (!doc->is_object()) return WrongType("(top level)", "an object", *doc);
  ClusterSpec cluster;
  cluster.name = "custom";
  if (const JsonValue* preset = doc->Find("preset")) {
    MUONSHARD_ASSIGN_OR_RETURN(const std::string name, String(*preset, "preset"));
    absl::StatusOr<ClusterSpec> base = Preset(name);
    if (!base.ok()) return absl::InvalidArgumentError(absl::StrCat("cluster.preset: ", base.status().message()));
    cluster = *std::move(base);
  }
  for (const JsonMember& m : doc->members()) MUONSHARD_RETURN_IF_ERROR(ApplyField(m, cluster));
  MUONSHARD_RETURN_IF_ERROR(ValidateCluster(cluster));
  return cluster;
}

std::string JsonArrayText(const std::vector<std::string>& items) {
  if (items.empty()) return "[]";
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    out += i == 0 ? "\n " : ",\n ";
    for (const char ch : items[i]) {
      out += ch;
      if (ch == '\n') out += ' ';
    }
  }
  return out + "\n]";
}

namespace {

std::string LinkJson(const LinkSpec& link) {
  return JsonObjectWriter()
      .Number("bandwidth_gb_s", link.bandwidth_gb_s)
      .Number("efficiency", link.efficiency)
      .Number("latency_us", link.latency_us)
      .Finish();
}

}  // namespace

std::string ClusterToJson(const ClusterSpec& c) {
  std::vector<std::string> table;
  for (const NsEfficiencyPoint& p : c.ns_efficiency) {
    table.push_back(JsonObjectWriter()
                        .Number("min_dim", static_cast<double>(p.min_dim))
                        .Number("efficiency", p.efficiency)
                        .Finish());
  }
  return JsonObjectWriter()
      .Raw("name", JsonString(c.name))
      .Number("gpus_per_node", c.gpus_per_node)
      .Number("nodes", c.nodes)
      .Raw("intra_node", LinkJson(c.intra_node))
      .Raw("inter_node", LinkJson(c.inter_node))
      .Raw("collective_library", JsonString(LibraryName(c.library)))
      .Raw("algorithm", JsonString(AlgorithmName(c.algorithm)))
      .Raw("nvls", c.nvls ? "true" : "false")
      .Raw("inter_node_shared", c.inter_node_shared ? "true" : "false")
      .Number("collective_base_us", c.collective_base_us)
      .Number("gemm_tflops", c.gemm_tflops)
      .Raw("ns_efficiency", JsonArrayText(table))
      .Raw("ns_batched", JsonObjectWriter()
                             .Number("matrices", static_cast<double>(c.ns_batched.matrices))
                             .Number("min_dim", static_cast<double>(c.ns_batched.min_dim))
                             .Number("efficiency", c.ns_batched.efficiency)
                             .Finish())
      .Number("ns_call_us", c.ns_call_us)
      .Number("hbm_gb_s", c.hbm_gb_s)
      .Number("hbm_efficiency", c.hbm_efficiency)
      .Number("adamw_efficiency", c.adamw_efficiency)
      .Number("kernel_launch_us", c.kernel_launch_us)
      .Number("host_collective_gb_s", c.host_collective_gb_s)
      .Finish();
}

}  // namespace muonshard::sim
