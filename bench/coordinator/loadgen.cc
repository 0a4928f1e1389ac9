// muonshard-loadgen: load against a running muonshard-coordinator.
//
//  1. Submits a dense model plan over --ranks ranks (the version under test).
//  2. GetPlan QPS: --clients requests in flight at all times (callback API),
//     spread over --channels TCP connections, each asking for one rank's view
//     (ranks round-robin), for --seconds. Reports QPS and latency quantiles.
//  3. Watch fan-out: --watchers Watch streams over --watch-channels
//     connections; then --rounds times: submit a new version and time until
//     the last watcher has received it (from the Submit reply, and from the
//     Submit call).
//
// Exit 0 when every call succeeded; 1 otherwise, after an "error: ..." line
// on stderr per failure (a refused Watch stream counts: the fan-out is only
// measured when all --watchers streams are open); 2 on bad flags.
#include <algorithm>
#include <atomic>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "common/flags.h"
#include "common/grpc_status.h"
#include "common/version.h"
#include "grpcpp/generic/generic_stub.h"

namespace muonshard::bench {
namespace {

using client::ConnectionOptions;
using client::CoordinatorClient;

struct Options {
  ConnectionOptions connection;
  int ranks = 1024;
  int pp = 1;
  int layers = 32;
  int hidden = 4096;
  int ffn = 11008;
  int vocab = 32000;
  int clients = 64;
  int channels = 4;
  double seconds = 10;
  int watchers = 1024;
  int watch_channels = 16;
  int rounds = 5;
  bool parse = false;
};

// A Llama-style dense decoder manifest. The model name carries this run's
// start time and `round`, so every submission is a new version (an identical
// request would return a stored one without computing or fanning out).
v1::ModelManifest Manifest(const Options& o, int round) {
  static const int64_t run = absl::ToUnixMicros(absl::Now());
  v1::ModelManifest m;
  m.set_model(absl::StrFormat("loadgen-l%d-h%d-%d-%d", o.layers, o.hidden, run, round));
  auto add = [&m](const std::string& name, std::vector<int64_t> shape) {
    v1::TensorSpec* t = m.add_tensors();
    t->set_name(name);
    for (int64_t d : shape) t->add_shape(d);
    t->set_dtype(v1::BF16);
  };
  add("model.embed_tokens.weight", {o.vocab, o.hidden});
  for (int l = 0; l < o.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "self_attn.q_proj.weight", {o.hidden, o.hidden});
    add(p + "self_attn.k_proj.weight", {o.hidden / 4, o.hidden});
    add(p + "self_attn.v_proj.weight", {o.hidden / 4, o.hidden});
    add(p + "self_attn.o_proj.weight", {o.hidden, o.hidden});
    add(p + "mlp.gate_proj.weight", {o.ffn, o.hidden});
    add(p + "mlp.up_proj.weight", {o.ffn, o.hidden});
    add(p + "mlp.down_proj.weight", {o.hidden, o.ffn});
    add(p + "input_layernorm.weight", {o.hidden});
    add(p + "post_attention_layernorm.weight", {o.hidden});
  }
  add("model.norm.weight", {o.hidden});
  add("lm_head.weight", {o.vocab, o.hidden});
  return m;
}

v1::SubmitPlanRequest SubmitRequest(const Options& o, int round) {
  v1::SubmitPlanRequest r;
  *r.mutable_request()->mutable_manifest() = Manifest(o, round);
  r.mutable_request()->mutable_topology()->set_world_size(o.ranks);
  r.mutable_request()->mutable_topology()->set_pp(o.pp);
  return r;
}

absl::StatusOr<std::vector<std::unique_ptr<CoordinatorClient>>> Connect(const Options& o, int n) {
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  ConnectionOptions c = o.connection;
  c.dedicated_connection = true;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<std::unique_ptr<CoordinatorClient>> client = CoordinatorClient::Connect(c);
    if (!client.ok()) return client.status();
    clients.push_back(*std::move(client));
  }
  return clients;
}

absl::StatusOr<v1::SubmitPlanResponse> Submit(CoordinatorClient& client, const Options& o, int round) {
  v1::SubmitPlanResponse response;
  auto ctx = client.NewContext();
  absl::Status s = client::FromGrpcStatus(client.stub().SubmitPlan(ctx.get(), SubmitRequest(o, round), &response));
  if (!s.ok()) return s;
  if (!response.created()) return absl::AlreadyExistsError("the request was already stored");
  return response;
}

double Quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// ---------------------------------------------------------------- GetPlan QPS

// One in-flight request slot: issues the next call from the previous one's
// callback until the deadline.
class QpsSlot {
 public:
  QpsSlot(CoordinatorClient* client, bool parse, int first_rank, int stride, int ranks, int64_t version,
          absl::Time deadline, absl::Mutex* mu, int* running)
      : client_(client),
        parse_(parse),
        generic_(client->channel()),
        rank_(first_rank),
        stride_(stride),
        ranks_(ranks),
        deadline_(deadline),
        mu_(mu),
        running_(running) {
    request_.set_version(version);
  }

  // With `parse`, through the generated stub (the client decodes every
  // RankView); otherwise as raw bytes, so the client's CPU (shared with the
  // server on a small machine) goes to making calls, not to decoding.
  void Issue() {
    ctx_ = client_->NewContext();
    request_.set_rank(rank_);
    rank_ = (rank_ + stride_) % ranks_;
    start_ = absl::Now();
    if (parse_) {
      client_->stub().async()->GetPlan(ctx_.get(), &request_, &response_,
                                       [this](grpc::Status s) { Done(std::move(s)); });
      return;
    }
    grpc::Slice slice(request_.SerializeAsString());
    raw_request_ = grpc::ByteBuffer(&slice, 1);
    generic_.UnaryCall(ctx_.get(), "/muonshard.v1.Coordinator/GetPlan", grpc::StubOptions(), &raw_request_,
                       &raw_response_, [this](grpc::Status s) { Done(std::move(s)); });
  }

  std::vector<double> latencies_us;
  int64_t errors = 0;
  int64_t bytes = 0;
  absl::Status first_error;

 private:
  void Done(grpc::Status s) {
    const absl::Time now = absl::Now();
    latencies_us.push_back(absl::ToDoubleMicroseconds(now - start_));
    if (s.ok()) {
      bytes += static_cast<int64_t>(parse_ ? response_.ByteSizeLong() : raw_response_.Length());
    } else if (errors++ == 0) {
      first_error = client::FromGrpcStatus(s);
    }
    if (now < deadline_) return Issue();
    absl::MutexLock lock(mu_);
    --*running_;
  }

  CoordinatorClient* const client_;
  const bool parse_;
  grpc::GenericStub generic_;
  int rank_;
  const int stride_;
  const int ranks_;
  const absl::Time deadline_;
  absl::Mutex* const mu_;
  int* const running_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  v1::GetPlanRequest request_;
  v1::GetPlanResponse response_;
  grpc::ByteBuffer raw_request_;
  grpc::ByteBuffer raw_response_;
  absl::Time start_;
};

absl::Status RunQps(const Options& o, std::vector<std::unique_ptr<CoordinatorClient>>& clients, int64_t version) {
  // No warm-up: the server builds a plan's shared view body on the first
  // request for a group set (NOTE [Shared view pieces]), so cold is warm.
  absl::Mutex mu;
  int running = o.clients;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + absl::Seconds(o.seconds);
  std::vector<std::unique_ptr<QpsSlot>> slots;
  for (int i = 0; i < o.clients; ++i) {
    slots.push_back(std::make_unique<QpsSlot>(clients[i % clients.size()].get(), o.parse, i % o.ranks, o.clients,
                                              o.ranks, version, deadline, &mu, &running));
  }
  for (auto& s : slots) s->Issue();
  {
    absl::MutexLock lock(&mu);
    auto done = [&running]() { return running == 0; };
    // Bounded: every call carries the client deadline (--timeout).
    mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(o.seconds + o.connection.timeout_s + 10));
  }
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  std::vector<double> lat;
  int64_t errors = 0;
  int64_t bytes = 0;
  absl::Status first_error;
  for (auto& s : slots) {
    lat.insert(lat.end(), s->latencies_us.begin(), s->latencies_us.end());
    errors += s->errors;
    bytes += s->bytes;
    if (first_error.ok()) first_error = s->first_error;
  }
  const double n = static_cast<double>(lat.size());
  std::cout << absl::StrFormat(
      "GetPlan rank views (%s): %d in flight over %d connections, %.1f s: %.0f calls, %.0f QPS, "
      "mean view %.1f KiB, latency p50 %.0f us p99 %.0f us max %.0f us, errors %d\n",
      o.parse ? "decoded" : "raw bytes", o.clients, clients.size(), elapsed, n, n / elapsed,
      n > 0 ? bytes / n / 1024 : 0, Quantile(lat, 0.5), Quantile(lat, 0.99), Quantile(lat, 1.0), errors);
  if (errors == 0) return absl::OkStatus();
  return absl::Status(first_error.code(), absl::StrFormat("GetPlan: %d of %.0f calls failed; first error: %s", errors,
                                                          n, first_error.ToString()));
}

// ---------------------------------------------------------------- fan-out

// Statuses of streams that ended, grouped ("CODE: message" -> streams) in
// the order first seen, for a bounded one-line report.
class StatusTally {
 public:
  void Add(const absl::Status& status) {
    const std::string key = status.ToString();
    for (auto& [text, count] : groups_) {
      if (text == key) {
        ++count;
        return;
      }
    }
    groups_.emplace_back(key, 1);
  }

  // "CODE: message" when all agree, else "3 x CODE: message | 1 x ...";
  // at most kMaxGroups groups of at most kMaxMessage characters each.
  std::string Summary() const {
    constexpr size_t kMaxGroups = 3;
    constexpr size_t kMaxMessage = 200;
    std::string out;
    for (size_t i = 0; i < groups_.size() && i < kMaxGroups; ++i) {
      std::string text = groups_[i].first;
      if (text.size() > kMaxMessage) text = text.substr(0, kMaxMessage) + "...";
      if (i > 0) out += " | ";
      if (groups_.size() > 1) absl::StrAppend(&out, groups_[i].second, " x ");
      out += text;
    }
    if (groups_.size() > kMaxGroups) {
      absl::StrAppend(&out, " | and ", groups_.size() - kMaxGroups, " other statuses");
    }
    return out;
  }

 private:
  std::vector<std::pair<std::string, int>> groups_;
};

// How the watch streams came up: open (at the version), refused (ended
// before their first event), or neither within the bound.
struct OpenCount {
  int open = 0;
  int refused = 0;
  int other = 0;
  StatusTally refusals;
};

// What every watcher has seen: the time each first saw a version >= target,
// and how the ones that ended ended.
class FanoutState {
 public:
  explicit FanoutState(int watchers) : seen_(watchers, 0), at_(watchers), ended_(watchers) {}

  void Saw(int watcher, int64_t version) {
    const absl::Time now = absl::Now();
    absl::MutexLock lock(&mu_);
    seen_[watcher] = std::max(seen_[watcher], version);
    at_[watcher] = now;
  }
  void Ended(int watcher, const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    ended_[watcher] = client::FromGrpcStatus(status);
    if (!ended_[watcher]->ok() && first_error_.ok()) first_error_ = *ended_[watcher];
  }

  // Waits (bounded) until each stream is at `version` or has ended, then
  // counts them. A stream counts as open only once the server sent it an
  // event: a refused Watch is a stream that ends without one.
  OpenCount WaitOpen(int64_t version, absl::Duration bound) {
    absl::MutexLock lock(&mu_);
    auto settled = [this, version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (size_t i = 0; i < seen_.size(); ++i) {
        if (seen_[i] < version && !ended_[i].has_value()) return false;
      }
      return true;
    };
    mu_.AwaitWithTimeout(absl::Condition(&settled), bound);
    OpenCount count;
    for (size_t i = 0; i < seen_.size(); ++i) {
      if (seen_[i] >= version && !ended_[i].has_value()) {
        ++count.open;
      } else if (seen_[i] == 0 && ended_[i].has_value()) {
        ++count.refused;
        count.refusals.Add(*ended_[i]);
      } else {
        ++count.other;
      }
    }
    return count;
  }

  // Waits until every watcher saw `version` (bounded); their arrival times,
  // or nothing when one did not (a stream that ends ends the wait).
  std::vector<absl::Time> WaitAll(int64_t version, absl::Duration bound) {
    absl::MutexLock lock(&mu_);
    auto all = [this, version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (size_t i = 0; i < seen_.size(); ++i) {
        if (seen_[i] < version) return ended_[i].has_value();
      }
      return true;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&all), bound)) return {};
    for (int64_t v : seen_) {
      if (v < version) return {};
    }
    return at_;
  }
  absl::Status first_error() {
    absl::MutexLock lock(&mu_);
    return first_error_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int64_t> seen_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> at_ ABSL_GUARDED_BY(mu_);
  std::vector<std::optional<absl::Status>> ended_ ABSL_GUARDED_BY(mu_);
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

class WatchStream final : public grpc::ClientReadReactor<v1::WatchEvent> {
 public:
  WatchStream(CoordinatorClient* client, int index, FanoutState* state)
      : index_(index), state_(state), ctx_(client->NewContext(/*streaming=*/true)) {
    client->stub().async()->Watch(ctx_.get(), &request_, this);  // from the latest version
    StartRead(&event_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (event_.has_plan()) state_->Saw(index_, event_.plan().version());
    StartRead(&event_);
  }
  void OnDone(const grpc::Status& s) override {
    state_->Ended(index_, s);
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  void Cancel() { ctx_->TryCancel(); }
  void AwaitDone() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }

 private:
  const int index_;
  FanoutState* const state_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  v1::WatchRequest request_;
  v1::WatchEvent event_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// Opens the streams and reports how many the server accepted; an error
// unless all of them are open at `version`.
absl::Status OpenStreams(const Options& o, std::vector<std::unique_ptr<CoordinatorClient>>& clients, int64_t version,
                         FanoutState& state, std::vector<std::unique_ptr<WatchStream>>& streams) {
  constexpr absl::Duration kOpenBound = absl::Seconds(60);
  const absl::Time open_start = absl::Now();
  for (int i = 0; i < o.watchers; ++i) {
    streams.push_back(std::make_unique<WatchStream>(clients[i % clients.size()].get(), i, &state));
  }
  OpenCount count = state.WaitOpen(version, kOpenBound);
  std::cout << absl::StrFormat("%d of %d watch streams over %d connections open and at v%d in %.2f s", count.open,
                               o.watchers, clients.size(), version, absl::ToDoubleSeconds(absl::Now() - open_start));
  if (count.refused > 0) {
    std::cout << absl::StrFormat("; %d refused: %s", count.refused, count.refusals.Summary());
  }
  if (count.other > 0) {
    std::cout << absl::StrFormat("; %d neither open nor refused after %s", count.other,
                                 absl::FormatDuration(kOpenBound));
  }
  std::cout << "\n";
  if (count.open == o.watchers) return absl::OkStatus();
  std::string why;
  if (count.refused > 0) {
    why = absl::StrFormat("%d of %d watch streams were refused (%s)", count.refused, o.watchers,
                          count.refusals.Summary());
  }
  if (count.other > 0) {
    absl::StrAppend(&why, why.empty() ? "" : "; ",
                    absl::StrFormat("%d of %d watch streams were not open at v%d after %s", count.other, o.watchers,
                                    version, absl::FormatDuration(kOpenBound)));
  }
  return absl::UnavailableError(absl::StrCat("fan-out not measured: ", why));
}

absl::Status RunFanout(const Options& o, CoordinatorClient& submitter, int64_t version) {
  absl::StatusOr<std::vector<std::unique_ptr<CoordinatorClient>>> clients = Connect(o, o.watch_channels);
  if (!clients.ok()) return clients.status();
  FanoutState state(o.watchers);
  std::vector<std::unique_ptr<WatchStream>> streams;
  absl::Status status = OpenStreams(o, *clients, version, state, streams);
  std::vector<double> spread_ms;
  std::vector<double> from_call_ms;
  for (int round = 0; status.ok() && round < o.rounds; ++round) {
    const absl::Time call = absl::Now();
    absl::StatusOr<v1::SubmitPlanResponse> r = Submit(submitter, o, round + 1);
    const absl::Time reply = absl::Now();
    if (!r.ok()) {
      status = absl::Status(r.status().code(), absl::StrCat("submit: ", r.status().ToString()));
      break;
    }
    std::vector<absl::Time> at = state.WaitAll(r->version(), absl::Seconds(60));
    if (at.empty()) {
      const absl::Status ended = state.first_error();
      status = absl::Status(ended.ok() ? absl::StatusCode::kDeadlineExceeded : ended.code(),
                            absl::StrCat("not every watcher saw v", r->version(),
                                         ended.ok() ? " within 60 s" : absl::StrCat(": ", ended.ToString())));
      break;
    }
    // Watchers may see the version before the submitter sees its reply (the
    // server wakes them before replying), so the spread from the first to the
    // last watcher is the fan-out's own cost.
    const absl::Time first = *std::min_element(at.begin(), at.end());
    const absl::Time last = *std::max_element(at.begin(), at.end());
    std::cout << absl::StrFormat(
        "fan-out v%d to %d watchers: last watcher %.1f ms after the Submit reply, %.1f ms after "
        "the Submit call (reply after %.1f ms); first-to-last watcher spread %.1f ms\n",
        r->version(), o.watchers, absl::ToDoubleMilliseconds(last - reply), absl::ToDoubleMilliseconds(last - call),
        absl::ToDoubleMilliseconds(reply - call), absl::ToDoubleMilliseconds(last - first));
    spread_ms.push_back(absl::ToDoubleMilliseconds(last - first));
    from_call_ms.push_back(absl::ToDoubleMilliseconds(last - call));
  }
  if (!spread_ms.empty()) {
    std::cout << absl::StrFormat(
        "fan-out summary over %d rounds: worst spread %.1f ms, worst Submit-call-to-last-watcher "
        "%.1f ms\n",
        spread_ms.size(), Quantile(spread_ms, 1.0), Quantile(from_call_ms, 1.0));
  }
  for (auto& s : streams) s->Cancel();
  for (auto& s : streams) s->AwaitDone();
  return status;
}

int Run(int argc, char** argv) {
  FlagSet flags(
      "usage: muonshard-loadgen --coordinator HOST:PORT [--ranks 1024] [--pp 1] [--clients 64]\n"
      "         [--channels 4] [--seconds 10] [--watchers 1024] [--watch-channels 16] [--rounds "
      "5]");
  Options o;
  o.connection.Register(flags);
  flags.Int("ranks", &o.ranks, "world size of the plan under test");
  flags.Int("pp", &o.pp, "pipeline stages of the plan under test");
  flags.Int("layers", &o.layers, "decoder layers of the generated model");
  flags.Int("hidden", &o.hidden, "hidden size");
  flags.Int("ffn", &o.ffn, "MLP size");
  flags.Int("vocab", &o.vocab, "vocabulary size");
  flags.Int("clients", &o.clients, "GetPlan requests in flight");
  flags.Int("channels", &o.channels, "connections for the GetPlan phase");
  flags.Double("seconds", &o.seconds, "length of the GetPlan phase (0 skips it)");
  flags.Int("watchers", &o.watchers, "watch streams (0 skips the fan-out phase)");
  flags.Int("watch-channels", &o.watch_channels, "connections for the watch streams");
  flags.Int("rounds", &o.rounds, "new versions submitted during the fan-out phase");
  flags.Bool("parse", &o.parse, "decode every GetPlan response into a RankView");
  absl::StatusOr<std::vector<std::string>> positional = flags.Parse(ArgsOf(argc, argv));
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (flags.version_requested()) {
    std::cout << VersionLine("muonshard-loadgen") << "\n";
    return 0;
  }
  if (!positional.ok() || !positional->empty() || o.ranks < 1 || o.clients < 1 || o.channels < 1 ||
      o.watch_channels < 1) {
    std::cerr << "error: " << (positional.ok() ? "bad flag values" : positional.status().message()) << "\n\n"
              << flags.Usage();
    return 2;
  }
  absl::StatusOr<std::vector<std::unique_ptr<CoordinatorClient>>> clients = Connect(o, o.channels);
  if (!clients.ok()) {
    std::cerr << "error: " << clients.status() << "\n";
    return 2;
  }
  const absl::Time t = absl::Now();
  absl::StatusOr<v1::SubmitPlanResponse> plan = Submit(*(*clients)[0], o, 0);
  if (!plan.ok()) {
    std::cerr << "error: submit: " << plan.status() << "\n";
    return 1;
  }
  std::cout << absl::StrFormat(
      "plan v%d: %d ranks, pp %d, %d tensors, %.1f MiB serialized (%.1f MiB stored), submit "
      "%.2f s\n",
      plan->version(), o.ranks, o.pp, plan->info().tensors(), plan->info().plan_bytes() / 1048576.0,
      plan->info().stored_bytes() / 1048576.0, absl::ToDoubleSeconds(absl::Now() - t));
  std::vector<absl::Status> phases;
  if (o.seconds > 0) phases.push_back(RunQps(o, *clients, plan->version()));
  if (o.watchers > 0) phases.push_back(RunFanout(o, *(*clients)[0], plan->version()));
  int exit_code = 0;
  for (const absl::Status& s : phases) {
    if (s.ok()) continue;
    std::cerr << "error: " << s.message() << "\n";
    exit_code = 1;
  }
  return exit_code;
}

}  // namespace
}  // namespace muonshard::bench

int main(int argc, char** argv) { return muonshard::bench::Run(argc, argv); }
