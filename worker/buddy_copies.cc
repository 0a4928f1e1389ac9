#include "worker/buddy_copies.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace muonshard::worker {
namespace {

// A copy's header: magic, the optimizer's step, the scalars, the float count.
struct Header {
  char magic[4] = {'M', 'S', 'B', 'C'};
  int64_t step = 0;
  int64_t scalars_step = 0;
  float beta1_pow = 1.0f;
  float beta2_pow = 1.0f;
  int64_t floats = 0;
};

int64_t FloatCount(const std::vector<checkpoint::StateShard>& shards) {
  int64_t n = 0;
  for (const checkpoint::StateShard& s : shards) n += static_cast<int64_t>(s.data.size());
  return n;
}

size_t EncodedBytes(const std::vector<checkpoint::StateShard>& shards) {
  return sizeof(Header) + static_cast<size_t>(FloatCount(shards)) * sizeof(float);
}

std::string Encode(const std::vector<checkpoint::StateShard>& shards, const checkpoint::Scalars& scalars,
                   int64_t step) {
  Header h;
  h.step = step;
  h.scalars_step = scalars.step;
  h.beta1_pow = scalars.beta1_pow;
  h.beta2_pow = scalars.beta2_pow;
  h.floats = FloatCount(shards);
  std::string out(EncodedBytes(shards), '\0');
  std::memcpy(out.data(), &h, sizeof(h));
  size_t at = sizeof(h);
  for (const checkpoint::StateShard& s : shards) {
    std::memcpy(out.data() + at, s.data.data(), s.data.size() * sizeof(float));
    at += s.data.size() * sizeof(float);
  }
  return out;
}

absl::StatusOr<Header> ReadHeader(const std::string& bytes) {
  Header h;
  if (bytes.size() < sizeof(h)) {
    return absl::InvalidArgumentError(absl::StrCat("buddy copy of ", bytes.size(), " bytes has no header"));
  }
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (std::memcmp(h.magic, "MSBC", 4) != 0 || h.floats < 0 ||
      bytes.size() != sizeof(h) + static_cast<size_t>(h.floats) * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed buddy copy (", bytes.size(), " bytes)"));
  }
  return h;
}

// Fills `shards` from a copy taken of the same shards.
absl::StatusOr<checkpoint::Scalars> Decode(const std::string& bytes,
                                           const std::vector<checkpoint::StateShard>& shards) {
  MUONSHARD_ASSIGN_OR_RETURN(Header h, ReadHeader(bytes));
  if (h.floats != FloatCount(shards)) {
    return absl::InvalidArgumentError(
        absl::StrCat("buddy copy holds ", h.floats, " floats; this rank's state has ", FloatCount(shards)));
  }
  size_t at = sizeof(h);
  for (const checkpoint::StateShard& s : shards) {
    std::memcpy(s.data.data(), bytes.data() + at, s.data.size() * sizeof(float));
    at += s.data.size() * sizeof(float);
  }
  checkpoint::Scalars scalars;
  scalars.step = h.scalars_step;
  scalars.beta1_pow = h.beta1_pow;
  scalars.beta2_pow = h.beta2_pow;
  return scalars;
}

bool Holds(const std::vector<int64_t>& steps, int64_t step) {
  return std::find(steps.begin(), steps.end(), step) != steps.end();
}

std::string JoinSteps(const std::vector<int64_t>& steps) { return absl::StrJoin(steps, ","); }

absl::StatusOr<std::vector<int64_t>> ParseSteps(absl::string_view text) {
  std::vector<int64_t> steps;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t step = 0;
    if (!absl::SimpleAtoi(part, &step)) {
      return absl::InvalidArgumentError(absl::StrCat("buddy holdings: bad step \"", part.substr(0, 32), "\""));
    }
    steps.push_back(step);
  }
  return steps;
}

}  // namespace

std::optional<BuddyRestorePlan> PlanBuddyRestore(const std::vector<BuddyHoldings>& holdings,
                                                 const std::string& plan_hash) {
  const int world = static_cast<int>(holdings.size());
  if (world < 2) return std::nullopt;
  std::set<int64_t, std::greater<int64_t>> candidates;
  for (const BuddyHoldings& h : holdings) {
    if (h.plan_hash == plan_hash) candidates.insert(h.own_steps.begin(), h.own_steps.end());
  }
  for (int64_t step : candidates) {
    BuddyRestorePlan plan;
    plan.step = step;
    for (int r = 0; r < world && static_cast<int>(plan.source.size()) == r; ++r) {
      const BuddyHoldings& self = holdings[r];
      const BuddyHoldings& right = holdings[(r + 1) % world];
      if (self.plan_hash == plan_hash && Holds(self.own_steps, step)) {
        plan.source.push_back(-1);
      } else if (right.plan_hash == plan_hash && Holds(right.left_steps, step)) {
        plan.source.push_back((r + 1) % world);
      }
    }
    if (static_cast<int>(plan.source.size()) == world) return plan;
  }
  return std::nullopt;
}

std::string EncodeHoldings(const BuddyHoldings& holdings) {
  return absl::StrCat(holdings.plan_hash, "|", JoinSteps(holdings.own_steps), "|", JoinSteps(holdings.left_steps));
}

absl::StatusOr<BuddyHoldings> DecodeHoldings(const std::string& text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, '|');
  if (parts.size() != 3) return absl::InvalidArgumentError("buddy holdings: not hash|own|left");
  BuddyHoldings h;
  h.plan_hash = std::string(parts[0]);
  MUONSHARD_ASSIGN_OR_RETURN(h.own_steps, ParseSteps(parts[1]));
  MUONSHARD_ASSIGN_OR_RETURN(h.left_steps, ParseSteps(parts[2]));
  return h;
}

absl::Status BuddyCopies::Refresh(ByteChannel& channel, const std::vector<checkpoint::StateShard>& shards,
                                  const checkpoint::Scalars& scalars, int64_t step, const std::string& plan_hash) {
  if (plan_hash != plan_hash_) {  // another plan: the old copies restore nothing
    own_.clear();
    left_.clear();
    plan_hash_ = plan_hash;
  }
  const int world = channel.size();
  const int right = (channel.rank() + 1) % world;
  const int left = (channel.rank() + world - 1) % world;
  Copy own{step, Encode(shards, scalars, step)};
  uint64_t send_size = own.bytes.size();
  uint64_t recv_size = 0;
  MUONSHARD_RETURN_IF_ERROR(
      channel.Exchange(right, &send_size, sizeof(send_size), left, &recv_size, sizeof(recv_size)));
  Copy received{step, std::string(recv_size, '\0')};
  MUONSHARD_RETURN_IF_ERROR(
      channel.Exchange(right, own.bytes.data(), own.bytes.size(), left, received.bytes.data(), received.bytes.size()));
  MUONSHARD_RETURN_IF_ERROR(ReadHeader(received.bytes).status());
  // Held next to the previous pair until every rank has the new one.
  if (own_.size() == 2) own_.erase(own_.begin());
  if (left_.size() == 2) left_.erase(left_.begin());
  own_.push_back(std::move(own));
  left_.push_back(std::move(received));
  MUONSHARD_RETURN_IF_ERROR(channel.Barrier());
  own_.erase(own_.begin(), own_.end() - 1);
  left_.erase(left_.begin(), left_.end() - 1);
  return absl::OkStatus();
}

BuddyHoldings BuddyCopies::holdings() const {
  BuddyHoldings h;
  h.plan_hash = plan_hash_;
  for (const Copy& c : own_) h.own_steps.push_back(c.step);
  for (const Copy& c : left_) h.left_steps.push_back(c.step);
  return h;
}

const BuddyCopies::Copy* BuddyCopies::OwnAt(int64_t step) const {
  for (const Copy& c : own_) {
    if (c.step == step) return &c;
  }
  return nullptr;
}

const BuddyCopies::Copy* BuddyCopies::LeftAt(int64_t step) const {
  for (const Copy& c : left_) {
    if (c.step == step) return &c;
  }
  return nullptr;
}

absl::StatusOr<checkpoint::Scalars> BuddyCopies::Restore(ByteChannel& channel, const BuddyRestorePlan& plan,
                                                         const std::vector<checkpoint::StateShard>& shards,
                                                         const std::string& plan_hash) {
  const int world = channel.size();
  const int rank = channel.rank();
  const int right = (rank + 1) % world;
  const int left = (rank + world - 1) % world;
  const Copy* to_send = plan.source[left] == rank ? LeftAt(plan.step) : nullptr;
  if (plan.source[left] == rank && to_send == nullptr) {
    return absl::InternalError(absl::StrCat("buddy restore: no copy of rank ", left, " at step ", plan.step));
  }
  std::string received(plan.source[rank] == right ? EncodedBytes(shards) : 0, '\0');
  MUONSHARD_RETURN_IF_ERROR(channel.Exchange(left, to_send != nullptr ? to_send->bytes.data() : nullptr,
                                             to_send != nullptr ? to_send->bytes.size() : 0, right, received.data(),
                                             received.size()));
  if (plan.source[rank] == -1) {
    const Copy* own = OwnAt(plan.step);
    if (own == nullptr) return absl::InternalError(absl::StrCat("buddy restore: no own copy at step ", plan.step));
    return Decode(own->bytes, shards);
  }
  MUONSHARD_ASSIGN_OR_RETURN(checkpoint::Scalars scalars, Decode(received, shards));
  // What it received is its own state now: keep it as its snapshot.
  if (plan_hash_ != plan_hash) left_.clear();
  plan_hash_ = plan_hash;
  own_.assign(1, Copy{plan.step, std::move(received)});
  return scalars;
}

int64_t BuddyCopies::held_bytes() const {
  int64_t n = 0;
  for (const Copy& c : own_) n += static_cast<int64_t>(c.bytes.size());
  for (const Copy& c : left_) n += static_cast<int64_t>(c.bytes.size());
  return n;
}

}  // namespace muonshard::worker
