#include "python/src/session_options.h"

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "kernels/newton_schulz.h"
#include "pybind11/stl.h"
#include "python/src/status.h"

namespace muonshard::python {
namespace {

namespace py = pybind11;

// Names of the Newton-Schulz coefficient sets and matmul precisions, in
// enum order where the enum is dense.
struct Named {
  const char* name;
  int value;
};
constexpr Named kCoefficientSets[] = {
    {"simple", static_cast<int>(kernels::NsCoefficientSet::kSimple)},
    {"quintic", static_cast<int>(kernels::NsCoefficientSet::kQuintic)},
    {"polar_express", static_cast<int>(kernels::NsCoefficientSet::kPolarExpress)},
    {"aol", static_cast<int>(kernels::NsCoefficientSet::kAol)},
    {"deepseekv4", static_cast<int>(kernels::NsCoefficientSet::kDeepseekV4)},
};
constexpr Named kPrecisions[] = {
    {"default", static_cast<int>(kernels::MatmulPrecision::kDefault)},
    {"fp32", static_cast<int>(kernels::MatmulPrecision::kFp32)},
    {"bf16", static_cast<int>(kernels::MatmulPrecision::kBf16)},
};

template <size_t N>
int ValueNamed(const Named (&table)[N], const std::string& option, const std::string& name) {
  std::vector<std::string> names;
  for (const Named& n : table) {
    if (name == n.name) return n.value;
    names.push_back(n.name);
  }
  const std::string last = names.back();
  names.pop_back();
  RaiseStatus(absl::InvalidArgumentError(
      absl::StrCat(option, " \"", name, "\" is not ", absl::StrJoin(names, ", "), " or ", last)));
}

template <size_t N>
std::string NameOf(const Named (&table)[N], int value) {
  for (const Named& n : table) {
    if (n.value == value) return n.name;
  }
  return "?";
}

// One keyword: reads a (non-None) value into the settings, and gives the
// settings' value (of default settings: the default).
struct Option {
  const char* name;
  std::function<void(py::handle, SessionSettings&)> set;
  std::function<py::object(const SessionSettings&)> get;
};

// An option that is a plain field: `field` selects it.
template <typename T, typename Field>
Option Plain(const char* name, Field field) {
  return {name, [field](py::handle v, SessionSettings& s) { field(s) = v.cast<T>(); },
          [field](const SessionSettings& s) { return py::cast(field(s)); }};
}

// The shortest decimal that is `v` as a float: the default 0.02f reads
// 0.02 in Python, not 0.019999999552965164.
double ShortestDecimal(float v) {
  for (int digits = 6; digits < 9; ++digits) {
    const double d = std::strtod(absl::StrFormat("%.*g", digits, v).c_str(), nullptr);
    if (static_cast<float>(d) == v) return d;
  }
  return v;
}

// A float field (Python reads its default as ShortestDecimal).
template <typename Field>
Option Float(const char* name, Field field) {
  return {name, [field](py::handle v, SessionSettings& s) { field(s) = v.cast<float>(); },
          [field](const SessionSettings& s) { return py::cast(ShortestDecimal(field(s))); }};
}

// A duration given in seconds.
template <typename Field>
Option Seconds(const char* name, Field field) {
  return {name, [field](py::handle v, SessionSettings& s) { field(s) = absl::Seconds(v.cast<double>()); },
          [field](const SessionSettings& s) { return py::cast(absl::ToDoubleSeconds(field(s))); }};
}

// A field of the settings, for reading and writing alike.
#define MUONSHARD_FIELD(expr) \
  [](auto& s) -> auto& { return s.expr; }

const std::vector<Option>& Options() {
  static const auto* const options = new std::vector<Option>{
      // Where and who.
      Plain<std::string>("coordinator", MUONSHARD_FIELD(options.connection.coordinator)),
      Plain<std::string>("token_file", MUONSHARD_FIELD(options.connection.token_file)),
      Plain<std::string>("tls_ca", MUONSHARD_FIELD(options.connection.tls_ca)),
      Plain<double>("rpc_timeout", MUONSHARD_FIELD(options.connection.timeout_s)),
      Plain<std::string>("job", MUONSHARD_FIELD(options.job)),
      Plain<int64_t>("plan_version", MUONSHARD_FIELD(options.plan_version)),
      Plain<std::optional<int>>("rank", MUONSHARD_FIELD(options.rank)),
      Plain<std::string>("host", MUONSHARD_FIELD(options.host)),
      Plain<std::string>("device", MUONSHARD_FIELD(options.device)),
      // Backend, communication and the step.
      Plain<std::string>("backend", MUONSHARD_FIELD(options.backend)),
      Plain<int>("cuda_device", MUONSHARD_FIELD(options.cuda_device)),
      Plain<std::string>("reduce_order", MUONSHARD_FIELD(options.reduce_order)),
      Plain<std::string>("collectives", MUONSHARD_FIELD(options.collectives)),
      Plain<std::string>("step_schedule", MUONSHARD_FIELD(options.step_schedule)),
      Plain<int>("step_piece_kib", MUONSHARD_FIELD(options.step_piece_kib)),
      Plain<int>("muon_batch_mib", MUONSHARD_FIELD(options.muon_batch_mib)),
      Plain<std::string>("step_trace_dir", MUONSHARD_FIELD(options.step_trace_dir)),
      Plain<int>("step_trace_steps", MUONSHARD_FIELD(options.step_trace_steps)),
      Plain<std::string>("hostname", MUONSHARD_FIELD(options.hostname)),
      Plain<std::string>("interface", MUONSHARD_FIELD(options.interface)),
      Plain<int>("blas_threads", MUONSHARD_FIELD(options.blas_threads)),
      Plain<int>("local_rank", MUONSHARD_FIELD(options.local_rank)),
      Plain<int>("local_world_size", MUONSHARD_FIELD(options.local_world_size)),
      // /metrics.
      Plain<int>("metrics_port", MUONSHARD_FIELD(options.metrics_port)),
      Plain<std::string>("metrics_host", MUONSHARD_FIELD(options.metrics_host)),
      // Timeouts and recovery (NOTE [Recovery]).
      Seconds("comm_timeout", MUONSHARD_FIELD(options.comm_timeout)),
      Seconds("join_timeout", MUONSHARD_FIELD(options.join_timeout)),
      Seconds("rejoin_grace", MUONSHARD_FIELD(options.rejoin_grace)),
      Plain<int>("min_workers", MUONSHARD_FIELD(options.min_workers)),
      Plain<int>("max_restarts", MUONSHARD_FIELD(max_restarts)),
      // The optimizer (worker::OptimizerConfig).
      Float("lr", MUONSHARD_FIELD(config.lr)),
      Float("weight_decay", MUONSHARD_FIELD(config.weight_decay)),
      Float("muon_momentum", MUONSHARD_FIELD(config.muon_momentum)),
      Plain<bool>("nesterov", MUONSHARD_FIELD(config.nesterov)),
      Float("adamw_beta1", MUONSHARD_FIELD(config.adamw_beta1)),
      Float("adamw_beta2", MUONSHARD_FIELD(config.adamw_beta2)),
      // Paddle: adam_epsilon normalises Newton-Schulz too.
      {"eps", [](py::handle v, SessionSettings& s) { s.config.adamw_eps = s.config.ns.eps = v.cast<float>(); },
       [](const SessionSettings& s) { return py::cast(ShortestDecimal(s.config.adamw_eps)); }},
      Float("muon_extra_scale", MUONSHARD_FIELD(config.muon_extra_scale)),
      Plain<int>("ns_steps", MUONSHARD_FIELD(config.ns.steps)),
      {"ns_coefficients",
       [](py::handle v, SessionSettings& s) {
         s.config.ns.coefficient_set = static_cast<kernels::NsCoefficientSet>(
             ValueNamed(kCoefficientSets, "ns_coefficients", v.cast<std::string>()));
       },
       [](const SessionSettings& s) {
         return py::cast(NameOf(kCoefficientSets, static_cast<int>(s.config.ns.coefficient_set)));
       }},
      {"ns_precision",
       [](py::handle v, SessionSettings& s) {
         s.config.ns.precision =
             static_cast<kernels::MatmulPrecision>(ValueNamed(kPrecisions, "ns_precision", v.cast<std::string>()));
       },
       [](const SessionSettings& s) { return py::cast(NameOf(kPrecisions, static_cast<int>(s.config.ns.precision))); }},
      {"muon_scale_version",
       [](py::handle v, SessionSettings& s) {
         const int version = v.cast<int>();
         if (version < 1 || version > 3) {
           RaiseStatus(absl::InvalidArgumentError("muon_scale_version must be 1, 2 or 3"));
         }
         s.config.muon_scale_version = static_cast<kernels::MuonScaleVersion>(version);
       },
       [](const SessionSettings& s) { return py::cast(static_cast<int>(s.config.muon_scale_version)); }},
      {"no_decay",
       [](py::handle v, SessionSettings& s) {
         auto names = std::make_shared<absl::flat_hash_set<std::string>>();
         for (py::handle n : v) names->insert(n.cast<std::string>());
         s.config.apply_decay = [names](absl::string_view name) { return !names->contains(name); };
       },
       [](const SessionSettings&) { return py::cast(std::vector<std::string>{}); }},
  };
  return *options;
}

#undef MUONSHARD_FIELD

// Keywords the session handles itself.
constexpr const char* kSessionOwn[] = {"check_view"};

}  // namespace

SessionSettings::SessionSettings() {
  client::ApplyEnvironment(&options.connection);
  options.metrics_port = -1;  // a program's /metrics is off unless asked for
}

SessionSettings ParseSessionKwargs(const py::kwargs& kwargs) {
  SessionSettings s;
  for (const auto& [key, value] : kwargs) {
    const std::string name = key.cast<std::string>();
    bool known = false;
    for (const char* own : kSessionOwn) known = known || name == own;
    for (const Option& o : Options()) {
      if (name != o.name) continue;
      known = true;
      if (value.is_none()) break;
      try {
        o.set(value, s);
      } catch (py::cast_error&) {
        throw py::type_error(absl::StrCat("RankSession: ", name, " has the wrong type (",
                                          py::str(py::type::of(value)).cast<std::string>(), ")"));
      }
    }
    if (!known) throw py::type_error(absl::StrCat("RankSession got an unexpected keyword argument '", name, "'"));
  }
  ThrowIfError(worker::ValidateOptimizerConfig(s.config));
  return s;
}

py::dict SessionDefaults() {
  const SessionSettings defaults;
  py::dict d;
  for (const Option& o : Options()) d[o.name] = o.get(defaults);
  return d;
}

}  // namespace muonshard::python
