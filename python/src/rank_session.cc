// _muonshard.RankSession: one rank of a training job (worker/rank_session.h)
// driven from Python. muonshard.torch.ShardedMuonAdamW is built on it: the
// Python layer hands over gradients and reads parameters; every collective,
// kernel and checkpoint byte is the C++ step's.
//
// Memory crosses without copies where it can: gradients are read straight
// from the caller's float32 arrays (the buffer protocol), model copies are
// written straight into the caller's arrays, and part_storage() exposes the
// optimizer's own fused buffers as numpy arrays (NOTE [Part storage] in
// sharded_optimizer.h) that torch parameters and gradients can view. Every
// array handed out keeps the session alive.
//
// The GIL is released while the session joins, rendezvouses, steps, saves,
// loads, reports an error or recovers (all of which wait on peers or the
// coordinator).
//
// Recovery (NOTE [Recovery] in worker/rank_session.h): recover_from is the
// one recovery loop (worker::RecoveryDriver), which muonshard-worker runs
// too; muonshard.torch.ShardedMuonAdamW hands it what to restore. Recover() destroys the
// optimizer first, so the arrays part_storage() handed out point at freed
// memory from then on: the caller stops using them before recover(). After a
// failed recover() there is no optimizer: everything that needs it raises
// FAILED_PRECONDITION (a muonshard error) until a recover() succeeds.

#include "worker/rank_session.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "checkpoint/state.h"
#include "common/status_macros.h"
#include "kernels/newton_schulz.h"
#include "plan/model.h"
#include "plan/tp_mesh.h"
#include "pybind11/numpy.h"
#include "pybind11/stl.h"
#include "python/src/bindings.h"
#include "python/src/session_options.h"
#include "python/src/session_values.h"
#include "python/src/status.h"
#include "worker/optimizer/gradient_source.h"
#include "worker/optimizer/step_trace.h"
#include "worker/recovery_driver.h"

namespace muonshard::python {
namespace {

namespace py = pybind11;
class PyRankSession {
 public:
  explicit PyRankSession(py::kwargs kwargs) : PyRankSession(ParseSessionKwargs(kwargs), kwargs) {}

  PyRankSession(SessionSettings settings, const py::kwargs& kwargs) : recovery_(settings.max_restarts) {
    worker::RankSessionOptions& options = settings.options;
    const worker::OptimizerConfig& config = settings.config;
    if (kwargs.contains("check_view") && !kwargs["check_view"].is_none()) {
      // The session keeps its options (and so this callable) until it is
      // destroyed, maybe without the GIL: the reference is dropped under it.
      std::shared_ptr<py::object> check(new py::object(kwargs["check_view"]), [](py::object* o) {
        py::gil_scoped_acquire gil;
        delete o;
      });
      options.check_view = [check](const client::JoinedJob& joined, const v1::RankView& view) -> absl::Status {
        py::gil_scoped_acquire gil;
        try {
          py::dict info;
          info["rank"] = joined.rank;
          info["world_size"] = joined.world_size;
          info["plan_version"] = joined.plan_version;
          info["model"] = view.model();
          info["tp"] = std::max(1, view.topology().tp());
          info["tp_rank"] = view.rank().tp_rank();
          info["tp_mesh"] = py::tuple(py::cast(planner::TpMeshOf(view.topology())));
          (*check)(info, HeldParts(view));
        } catch (py::error_already_set& e) {
          // The check's message, as INVALID_ARGUMENT (ValueError).
          return absl::InvalidArgumentError(py::str(e.value()).cast<std::string>());
        }
        return absl::OkStatus();
      };
    }
    absl::StatusOr<std::unique_ptr<worker::RankSession>> session;
    {
      py::gil_scoped_release release;
      session = recovery_.Start(options, config);
    }
    session_ = ValueOrThrow(std::move(session));
    trace_ = worker::StepTraceLog(options.step_trace_dir, options.step_trace_steps);
  }

  int rank() const { return session().rank(); }
  int world_size() const { return session().world_size(); }
  int64_t generation() const { return session().joined().generation; }
  int64_t plan_version() const { return session().joined().plan_version; }
  const std::string& content_hash() const { return session().joined().content_hash; }
  const std::string& job() const { return session().joined().job; }
  std::string model() const { return session().view().model(); }
  int metrics_port() const { return session().metrics_port(); }
  std::string describe() const { return group().Describe(); }
  py::list held() const { return HeldParts(session().view()); }
  float lr() const { return optimizer().lr(); }
  int64_t steps_done() const { return optimizer().steps_done(); }
  bool has_group() const { return session_ != nullptr && group_; }

  void SetLr(float lr) { ThrowIfError(optimizer().SetLearningRate(lr)); }

  void CheckHealth() const { ThrowIfError(session().health()); }

  // (params, grads) DLPack capsules over the optimizer's own buffers, in the
  // backend's memory (the host's or the GPU's), or None where the part
  // cannot be viewed (NOTE [Part storage]).
  py::object PartStorage(py::object self, int tensor) {
    absl::StatusOr<worker::ShardedOptimizer::PartStorage> s = optimizer().BackendPartStorage(tensor);
    if (s.status().code() == absl::StatusCode::kFailedPrecondition) return py::none();
    worker::ShardedOptimizer::PartStorage storage = ValueOrThrow(std::move(s));
    const MemoryDevice device = memory_device();
    return py::make_tuple(DlpackOver(storage.params, storage.param_dtype, storage.numel, device, self),
                          DlpackOver(storage.grads, storage.grad_dtype, storage.numel, device, self));
  }

  int64_t host_copies() const { return optimizer().host_copies(); }

  // Writes each part's model copy into the caller's memory in the backend's
  // space ({plan tensor index: (address, dtype name, numel)}: a CUDA
  // tensor's data_ptr() with backend nccl, host memory with gloo); returns
  // when they are written.
  void CopyModelCopiesTo(py::dict targets) {
    std::vector<worker::ShardedOptimizer::ModelCopyTarget> list;
    for (auto [key, value] : targets) {
      const int tensor = key.cast<int>();
      const TensorAddress t = AddressOf(value, tensor);
      list.push_back({tensor, reinterpret_cast<void*>(t.address), t.type, t.numel});
    }
    Blocking([&](worker::RankSession& rs) { return rs.optimizer().CopyModelCopiesTo(list); });
  }

  void SetParameter(int tensor, py::handle values) {
    FloatArray a = CheckedFloats(values, absl::StrCat("set_parameter(", tensor, ")"));
    ThrowIfError(optimizer().SetParameter(tensor, absl::MakeConstSpan(a.data(), a.size())));
  }

  void ReadModelCopy(int tensor, py::handle out) {
    FloatArray a = CheckedFloats(out, absl::StrCat("read_model_copy(", tensor, ")"));
    ThrowIfError(optimizer().ReadModelCopy(tensor, absl::MakeSpan(a.mutable_data(), a.size())));
  }

  void SyncModelCopies() {
    Blocking([&](worker::RankSession& rs) { return rs.optimizer().SyncModelCopies(); });
  }

  // One step with `grads` ({plan tensor index: float32 array of the part});
  // `loss` and `train_seconds` (the training step around it) go to /metrics.
  py::dict Step(py::dict grads, double loss, double train_seconds) {
    SpanGradients source;
    std::vector<FloatArray> keep;
    for (auto [key, value] : grads) {
      const int tensor = key.cast<int>();
      keep.push_back(CheckedFloats(value, absl::StrCat("gradient of plan tensor ", tensor)));
      source.Set(tensor, absl::MakeConstSpan(keep.back().data(), keep.back().size()));
    }
    return RunStep([&](worker::RankSession& rs) { return rs.optimizer().Step(source); }, loss, train_seconds);
  }

  // The step in three calls (NOTE [Gradient hand-off] in
  // worker/optimizer/sharded_optimizer.h): backward hooks hand each gradient
  // over as it is produced, so its bucket's reduce overlaps the rest of
  // backward. grad_ready copies `grad` before it returns.
  void BeginStep() {
    Blocking([&](worker::RankSession& rs) { return rs.optimizer().BeginStep(); });
  }

  // GradReady with the gradient in the backend's memory (as
  // step_addresses), after all work issued so far on `stream` (the caller's
  // CUDA stream that produced it; 0 with gloo).
  void GradReadyAddress(int tensor, uintptr_t address, const std::string& dtype, int64_t numel, uintptr_t stream) {
    const worker::BackendGradient grad =
        TensorAddress{address, ValueOrThrow(ElementTypeOf(dtype, tensor)), numel}.gradient();
    Blocking([&](worker::RankSession& rs) {
      MUONSHARD_RETURN_IF_ERROR(rs.optimizer().WaitForStream(stream));
      return rs.optimizer().GradReady(tensor, grad);
    });
  }

  void GradReady(int tensor, py::handle grad) {
    FloatArray values = CheckedFloats(grad, absl::StrCat("gradient of plan tensor ", tensor));
    Blocking([&](worker::RankSession& rs) {
      return rs.optimizer().GradReady(tensor, absl::MakeConstSpan(values.data(), values.size()));
    });
  }

  py::dict FinishStep(double loss, double train_seconds) {
    return RunStep([&](worker::RankSession& rs) { return rs.optimizer().FinishStep(); }, loss, train_seconds);
  }

  // One step with gradients given by address in the kernel backend's memory
  // ({plan tensor index: (address, dtype name, numel)}): a CUDA tensor's
  // data_ptr() with backend nccl, host memory with gloo. The memory must hold
  // the gradient until the step returns (the caller keeps the tensors). The
  // step runs after all work issued so far on `stream` (the caller's current
  // CUDA stream, whose backward pass wrote the gradients; 0 with gloo) and
  // returns with its results written.
  py::dict StepAddresses(py::dict grads, double loss, double train_seconds, uintptr_t stream) {
    worker::BackendGradientMap source;
    for (auto [key, value] : grads) {
      const int tensor = key.cast<int>();
      source.Set(tensor, AddressOf(value, tensor).gradient());
    }
    return RunStep(
        [&](worker::RankSession& rs) -> absl::StatusOr<worker::StepStats> {
          MUONSHARD_RETURN_IF_ERROR(rs.optimizer().WaitForStream(stream));
          return rs.optimizer().Step(source);
        },
        loss, train_seconds);
  }

  py::dict Memory() const {
    const worker::ShardedOptimizer& o = optimizer();
    py::dict d;
    d["optimizer_state"] = o.optimizer_state_bytes();
    d["model_copy"] = o.model_copy_bytes();
    d["gradients"] = o.gradient_buffer_bytes();
    d["plan_optimizer_state"] = session().view().rank().optimizer_state_bytes();
    return d;
  }

  // This rank's optimizer state: {"<tensor>/<kind>/<begin>:<end>": float32
  // array (a copy)}, with the scalars.
  py::dict State() {
    std::vector<checkpoint::StateShard> shards = ValueOrThrow(optimizer().StateShards());
    py::dict tensors;
    for (const checkpoint::StateShard& s : shards) {
      FloatArray a(static_cast<py::ssize_t>(s.data.size()));
      std::copy(s.data.begin(), s.data.end(), a.mutable_data());
      tensors[py::str(StateKey(s.spec))] = std::move(a);
    }
    const checkpoint::Scalars scalars = optimizer().scalars();
    py::dict out;
    out["tensors"] = std::move(tensors);
    out["step"] = scalars.step;
    out["beta1_pow"] = scalars.beta1_pow;
    out["beta2_pow"] = scalars.beta2_pow;
    return out;
  }

  // The inverse of State(): every shard must be present with its size.
  void LoadState(py::dict tensors, int64_t step, float beta1_pow, float beta2_pow) {
    std::vector<checkpoint::StateShard> shards = ValueOrThrow(optimizer().StateShards());
    for (const checkpoint::StateShard& s : shards) {
      const std::string key = StateKey(s.spec);
      if (!tensors.contains(key)) RaiseStatus(absl::InvalidArgumentError(absl::StrCat("state has no \"", key, "\"")));
      FloatArray a = CheckedFloats(tensors[py::str(key)], absl::StrCat("state \"", key, "\""));
      if (static_cast<size_t>(a.size()) != s.data.size()) {
        RaiseStatus(absl::InvalidArgumentError(
            absl::StrCat("state \"", key, "\" holds ", a.size(), " values, not ", s.data.size())));
      }
      std::copy(a.data(), a.data() + a.size(), s.data.begin());
    }
    if (static_cast<size_t>(py::len(tensors)) != shards.size()) {
      RaiseStatus(absl::InvalidArgumentError(absl::StrCat("state holds ", py::len(tensors), " tensors; rank ", rank(),
                                                          " of this plan has ", shards.size())));
    }
    checkpoint::Scalars scalars{step, beta1_pow, beta2_pow};
    Blocking([&](worker::RankSession& rs) { return rs.optimizer().RestoreFromState(scalars); });
  }

  void SaveCheckpoint(const std::string& dir, int64_t step, float lr, float weight_decay,
                      const std::map<std::string, std::string>& extra) {
    v1::OptimizerHyperParams hyper;
    hyper.set_lr(lr);
    hyper.set_weight_decay(weight_decay);
    for (const auto& [k, v] : extra) (*hyper.mutable_extra())[k] = v;
    Blocking([&](worker::RankSession& rs) { return rs.SaveCheckpoint(dir, step, hyper); });
  }

  py::dict LoadCheckpoint(const std::string& dir, std::optional<int64_t> step) {
    worker::RankSession& rs = group();
    absl::StatusOr<worker::LoadedCheckpoint> loaded;
    {
      py::gil_scoped_release release;
      loaded = rs.LoadCheckpoint(dir, step);
    }
    return LoadedDict(ValueOrThrow(std::move(loaded)));
  }

  // The newest committed checkpoint of `dir` loaded (its info), or None (and
  // nothing loaded) when `dir` holds none. A collective when there is one.
  py::object LoadLatestCheckpoint(const std::string& dir) {
    worker::RankSession& rs = group();
    absl::StatusOr<std::optional<worker::LoadedCheckpoint>> loaded;
    {
      py::gil_scoped_release release;
      loaded = rs.LoadLatestCheckpoint(dir);
    }
    std::optional<worker::LoadedCheckpoint> l = ValueOrThrow(std::move(loaded));
    if (!l.has_value()) return py::none();
    return LoadedDict(*l);
  }

  // Tells the coordinator this rank failed with (code, message): the job
  // moves to a new generation now and the peers learn why; an error that is
  // not a broken group's ends the job (a failed report is logged, not
  // raised). `code` is a status code name ("ABORTED"). Returns (code,
  // message) of the job's failure when another rank's error ended it first
  // (NOTE [Job failure]: the error to end with), else None.
  std::optional<std::pair<std::string, std::string>> ReportError(const std::string& code, const std::string& message) {
    const absl::Status error(ValueOrThrow(StatusCodeNamed(code)), message);
    if (error.ok()) RaiseStatus(absl::InvalidArgumentError("report_error needs an error code, not OK"));
    worker::RankSession& rs = session();
    absl::Status ending;
    {
      py::gil_scoped_release release;
      ending = rs.ReportError(error);
    }
    if (ending == error) return std::nullopt;
    return std::make_pair(absl::StatusCodeToString(ending.code()), std::string(ending.message()));
  }

  // NOTE [Recovery]: tears the group down, re-joins the job's new
  // generation, waits for every rank (the session's rejoin_grace; 0: its
  // comm_timeout) and re-creates the communicators and the optimizer (its
  // parameters unset: the caller loads a checkpoint or sets every held
  // tensor). The phases' seconds {"abort", "rendezvous"}. On an error there
  // is no optimizer until a recover() succeeds. (One step of recover_from's
  // loop, for tests of a session without its group.)
  py::dict Recover() {
    worker::RankSession& rs = session();
    group_ = false;  // the old optimizer is destroyed whatever Recover returns
    absl::StatusOr<worker::RecoveryTimes> times;
    {
      py::gil_scoped_release release;
      times = rs.Recover();
    }
    worker::RecoveryTimes t = ValueOrThrow(std::move(times));
    group_ = true;
    py::dict d;
    d["abort"] = absl::ToDoubleSeconds(t.abort);
    d["rendezvous"] = absl::ToDoubleSeconds(t.rendezvous);
    return d;
  }

  // NOTE [Recovery] (worker/recovery_driver.h): the one recovery loop.
  // Reports (code, message) and, while it is a broken group's and restarts
  // remain, tears the group down (before_teardown() first), re-joins and
  // calls restore(), which returns the step to continue from or (code,
  // message) for an error of its own (a failed attempt: tried again while
  // restarts remain). `detect`: seconds the failed step ran. Returns
  // {"step", "generation", "restart", "times": {"detect", "abort",
  // "rendezvous", "restore"}} or, when the rank gives up, {"error": (code,
  // message)}: the error to end with (the job's failure when another rank's
  // ended it first).
  py::dict RecoverFrom(const std::string& code, const std::string& message, double detect, py::object before_teardown,
                       py::object restore) {
    const absl::Status failure(ValueOrThrow(StatusCodeNamed(code)), message);
    if (failure.ok()) RaiseStatus(absl::InvalidArgumentError("recover_from needs an error code, not OK"));
    worker::RankSession& rs = session();
    // The callables are muonshard.torch's and catch their own errors; one
    // that escapes anyway fails the attempt (INTERNAL) instead of unwinding
    // through C++.
    worker::RecoveryHooks hooks;
    absl::Status teardown;
    hooks.before_teardown = [this, &before_teardown, &teardown] {
      py::gil_scoped_acquire gil;
      group_ = false;  // the old optimizer is destroyed whatever Recover returns
      teardown = CallHook(before_teardown).status();
    };
    hooks.restore = [this, &restore, &teardown]() -> absl::StatusOr<int64_t> {
      py::gil_scoped_acquire gil;
      group_ = true;
      if (!teardown.ok()) return teardown;
      return CallHook(restore);
    };
    absl::StatusOr<worker::Recovery> recovered;
    {
      py::gil_scoped_release release;
      recovered = recovery_.Recover(rs, failure, absl::Seconds(detect), hooks);
    }
    py::dict d;
    if (!recovered.ok()) {
      d["error"] = py::make_tuple(absl::StatusCodeToString(recovered.status().code()),
                                  std::string(recovered.status().message()));
      return d;
    }
    d["step"] = recovered->step;
    d["generation"] = recovered->generation;
    d["restart"] = recovered->restart;
    py::dict times;
    times["detect"] = absl::ToDoubleSeconds(recovered->phases.detect);
    times["abort"] = absl::ToDoubleSeconds(recovered->phases.abort);
    times["rendezvous"] = absl::ToDoubleSeconds(recovered->phases.rendezvous);
    times["restore"] = absl::ToDoubleSeconds(recovered->phases.restore);
    d["times"] = times;
    return d;
  }

  // hook(): None or an int (the step), or (code, message) for its error.
  static absl::StatusOr<int64_t> CallHook(const py::object& hook) {
    std::pair<std::string, std::string> error;
    try {
      py::object r = hook();
      if (r.is_none()) return 0;
      if (py::isinstance<py::int_>(r)) return r.cast<int64_t>();
      error = r.cast<std::pair<std::string, std::string>>();
    } catch (py::error_already_set& e) {
      return absl::InternalError(absl::StrCat("recovery hook raised: ", py::str(e.value()).cast<std::string>()));
    } catch (py::cast_error& e) {
      return absl::InternalError(absl::StrCat("recovery hook returned neither a step nor (code, message): ", e.what()));
    }
    MUONSHARD_ASSIGN_OR_RETURN(const absl::StatusCode code, StatusCodeNamed(error.first));
    return absl::Status(code, error.second);
  }

  int restarts() const { return recovery_.restarts(); }
  int max_restarts() const { return recovery_.max_restarts(); }

  void Barrier(const std::string& name) {
    Blocking([&](worker::RankSession& rs) { return rs.Barrier(name); });
  }

  void Finish() {
    Blocking([&](worker::RankSession& rs) { return rs.Finish(); });
  }

  // NOTE [Step trace]: the kept steps to <step_trace_dir>/step-trace-rank<R>.json;
  // the path, or None without a step_trace_dir.
  py::object WriteStepTrace() {
    std::optional<std::string> path = ValueOrThrow(trace_.Write(rank()));
    return path.has_value() ? py::object(py::str(*path)) : py::object(py::none());
  }

  // Destroys the session (leaving the job if Finish() did not run).
  void Close() {
    py::gil_scoped_release release;
    session_.reset();
  }

 private:
  // step(rs) with the GIL released, recorded in /metrics; its stats.
  template <typename StepFn>
  py::dict RunStep(StepFn step, double loss, double train_seconds) {
    worker::RankSession& rs = group();
    absl::StatusOr<worker::StepStats> stats;
    {
      py::gil_scoped_release release;
      stats = step(rs);
      if (stats.ok()) {
        rs.metrics().RecordStep(*stats, std::isfinite(loss) ? loss : 0.0, rs.view().rank().ns_flops(),
                                train_seconds > 0 ? train_seconds : stats->total_seconds);
        if (trace_.enabled()) trace_.Add(rs.optimizer().steps_done(), *stats);
      }
    }
    return StatsDict(ValueOrThrow(std::move(stats)));
  }

  // A tensor in the backend's memory as Python names it: (address, dtype
  // name, numel), e.g. a CUDA tensor's data_ptr().
  struct TensorAddress {
    uintptr_t address = 0;
    kernels::ElementType type = kernels::ElementType::kFloat32;
    int64_t numel = 0;
    worker::BackendGradient gradient() const {
      return worker::BackendGradient{reinterpret_cast<const void*>(address), type, numel};
    }
  };

  // `value`, an (address, dtype name, numel) tuple of plan tensor `tensor`'s
  // part; ValueError for an unknown dtype.
  static TensorAddress AddressOf(py::handle value, int tensor) {
    auto [address, dtype, numel] = value.cast<std::tuple<uintptr_t, std::string, int64_t>>();
    return TensorAddress{address, ValueOrThrow(ElementTypeOf(dtype, tensor)), numel};
  }

  static absl::StatusOr<kernels::ElementType> ElementTypeOf(const std::string& dtype, int tensor) {
    if (dtype == "float32") return kernels::ElementType::kFloat32;
    if (dtype == "bfloat16") return kernels::ElementType::kBFloat16;
    if (dtype == "float16") return kernels::ElementType::kFloat16;
    return absl::InvalidArgumentError(
        absl::StrCat("plan tensor ", tensor, ": dtype \"", dtype, "\" is not float32, bfloat16 or float16"));
  }

  // The memory of the session's kernel backend (the CUDA device, or the host).
  MemoryDevice memory_device() const {
    const int device = session().cuda_device();
    return device >= 0 ? MemoryDevice{true, device} : MemoryDevice{false, 0};
  }

  // The session; FAILED_PRECONDITION after close(). REQUIRES: the GIL.
  worker::RankSession& session() const {
    if (session_ == nullptr) RaiseStatus(absl::FailedPreconditionError("the muonshard session is closed"));
    return *session_;
  }

  // The session with its group (communicators and optimizer);
  // FAILED_PRECONDITION after close() or a failed recover(). REQUIRES: the
  // GIL.
  worker::RankSession& group() const {
    worker::RankSession& rs = session();
    if (!group_) {
      RaiseStatus(absl::FailedPreconditionError(
          "the muonshard session has no optimizer: its last recovery failed (recover again, or close it)"));
    }
    return rs;
  }

  worker::ShardedOptimizer& optimizer() const { return group().optimizer(); }

  static py::dict LoadedDict(const worker::LoadedCheckpoint& l) {
    py::dict d;
    d["step_dir"] = l.step_dir;
    d["step"] = l.step;
    d["plan_hash"] = l.plan_hash;
    d["world_size"] = l.world_size;
    d["bytes_read"] = l.bytes_read;
    return d;
  }

  // fn(session) with its group, the GIL released; its error raised.
  template <typename Fn>
  void Blocking(Fn fn) {
    worker::RankSession& rs = group();
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = fn(rs);
    }
    ThrowIfError(s);
  }

  worker::RecoveryDriver recovery_;  // NOTE [Recovery]: restarts counted across recoveries
  std::unique_ptr<worker::RankSession> session_;
  bool group_ = true;                  // false from a recover() until one succeeds
  worker::StepTraceLog trace_{"", 1};  // NOTE [Step trace]
};

}  // namespace

void BindRankSession(py::module_& m) {
  py::class_<PyRankSession>(m, "RankSession")
      .def(py::init<py::kwargs>())
      .def_property_readonly("rank", &PyRankSession::rank)
      .def_property_readonly("world_size", &PyRankSession::world_size)
      .def_property_readonly("generation", &PyRankSession::generation)
      .def_property_readonly("plan_version", &PyRankSession::plan_version)
      .def_property_readonly("content_hash", &PyRankSession::content_hash)
      .def_property_readonly("job", &PyRankSession::job)
      .def_property_readonly("model", &PyRankSession::model)
      .def_property_readonly("metrics_port", &PyRankSession::metrics_port)
      .def_property_readonly("lr", &PyRankSession::lr)
      .def_property_readonly("steps_done", &PyRankSession::steps_done)
      .def("describe", &PyRankSession::describe)
      .def("held", &PyRankSession::held)
      .def("set_lr", &PyRankSession::SetLr, py::arg("lr"))
      .def("check_health", &PyRankSession::CheckHealth)
      .def(
          "part_storage",
          [](py::object self, int tensor) { return self.cast<PyRankSession&>().PartStorage(self, tensor); },
          py::arg("tensor"))
      .def("set_parameter", &PyRankSession::SetParameter, py::arg("tensor"), py::arg("values"))
      .def("read_model_copy", &PyRankSession::ReadModelCopy, py::arg("tensor"), py::arg("out"))
      .def("sync_model_copies", &PyRankSession::SyncModelCopies)
      .def("step", &PyRankSession::Step, py::arg("grads"), py::arg("loss") = NAN, py::arg("train_seconds") = 0.0)
      .def("begin_step", &PyRankSession::BeginStep)
      .def("grad_ready", &PyRankSession::GradReady, py::arg("tensor"), py::arg("grad"))
      .def("finish_step", &PyRankSession::FinishStep, py::arg("loss") = NAN, py::arg("train_seconds") = 0.0)
      .def("step_addresses", &PyRankSession::StepAddresses, py::arg("grads"), py::arg("loss") = NAN,
           py::arg("train_seconds") = 0.0, py::arg("stream") = 0)
      .def("grad_ready_address", &PyRankSession::GradReadyAddress, py::arg("tensor"), py::arg("address"),
           py::arg("dtype"), py::arg("numel"), py::arg("stream") = 0)
      .def("copy_model_copies_to", &PyRankSession::CopyModelCopiesTo, py::arg("targets"))
      .def_property_readonly("host_copies", &PyRankSession::host_copies)
      .def("memory", &PyRankSession::Memory)
      .def("state", &PyRankSession::State)
      .def("load_state", &PyRankSession::LoadState, py::arg("tensors"), py::arg("step"), py::arg("beta1_pow"),
           py::arg("beta2_pow"))
      .def("save_checkpoint", &PyRankSession::SaveCheckpoint, py::arg("dir"), py::arg("step"), py::arg("lr"),
           py::arg("weight_decay"), py::arg("extra") = std::map<std::string, std::string>())
      .def("load_checkpoint", &PyRankSession::LoadCheckpoint, py::arg("dir"), py::arg("step") = py::none())
      .def("load_latest_checkpoint", &PyRankSession::LoadLatestCheckpoint, py::arg("dir"))
      .def_property_readonly("has_group", &PyRankSession::has_group)
      .def("report_error", &PyRankSession::ReportError, py::arg("code"), py::arg("message"))
      .def("recover", &PyRankSession::Recover)
      .def("recover_from", &PyRankSession::RecoverFrom, py::arg("code"), py::arg("message"), py::arg("detect"),
           py::arg("before_teardown"), py::arg("restore"))
      .def_property_readonly("restarts", &PyRankSession::restarts)
      .def_property_readonly("max_restarts", &PyRankSession::max_restarts)
      .def("barrier", &PyRankSession::Barrier, py::arg("name"))
      .def("finish", &PyRankSession::Finish)
      .def("write_step_trace", &PyRankSession::WriteStepTrace)
      .def("close", &PyRankSession::Close);
  m.def("session_defaults", &SessionDefaults,
        "{keyword: default} of every RankSession option: the C++ option structs' own defaults (the ones "
        "muonshard-worker's flags take), which muonshard.torch's keyword arguments use.");
  m.def(
      "is_broken_group",
      [](const std::string& code) {
        return worker::IsBrokenGroup(absl::Status(ValueOrThrow(StatusCodeNamed(code)), "?"));
      },
      py::arg("code"),
      "Whether an error of status code `code` (\"ABORTED\") means the group broke and a recovery applies "
      "(worker::IsBrokenGroup: ABORTED, UNAVAILABLE, DEADLINE_EXCEEDED).");
}

}  // namespace muonshard::python
