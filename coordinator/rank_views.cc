#include "coordinator/rank_views.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "plan/plan_view.h"

namespace muonshard::coordinator {
namespace {

using google::protobuf::internal::WireFormatLite;

// Tag and length prefix of a length-delimited field.
std::string FieldHeader(int field, size_t length) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    WireFormatLite::WriteTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, &coded);
    coded.WriteVarint64(length);
  }
  return out;
}

std::string Field(int field, const google::protobuf::MessageLite& message) {
  const std::string body = message.SerializeAsString();
  return FieldHeader(field, body.size()) + body;
}

// The rank's plan with the display names ExtractRankView also fills in
// (stored plans leave them empty; see OwnedTensor.name).
v1::RankPlan WithNames(const v1::Plan& plan, int rank) {
  v1::RankPlan r = plan.ranks(rank);
  for (v1::OwnedTensor& o : *r.mutable_owned()) o.set_name(plan.tensors(o.tensor()).name());
  for (v1::TensorSlice& s : *r.mutable_slices()) s.set_name(plan.tensors(s.tensor()).name());
  return r;
}

}  // namespace

std::string Concatenate(const SerializedPieces& pieces) {
  std::string out;
  for (const auto& p : pieces) out += *p;
  return out;
}

RankViews::RankViews(std::shared_ptr<const v1::Plan> plan, const v1::PlanVersionInfo& info)
    : plan_(std::move(plan)),
      info_field_(std::make_shared<const std::string>(Field(v1::GetPlanResponse::kInfoFieldNumber, info))) {
  // Signature of a rank: the ids of the groups it is in, ascending.
  std::vector<std::vector<int>> groups_of(plan_->ranks_size());
  for (const v1::CommGroup& g : plan_->groups()) {
    for (int r : g.ranks()) {
      if (r >= 0 && r < plan_->ranks_size()) groups_of[r].push_back(g.id());
    }
  }
  absl::flat_hash_map<std::vector<int>, int> ids;
  signature_of_rank_.resize(plan_->ranks_size());
  for (int r = 0; r < plan_->ranks_size(); ++r) {
    auto [it, inserted] = ids.try_emplace(std::move(groups_of[r]), static_cast<int>(ids.size()));
    if (inserted) representative_.push_back(r);
    signature_of_rank_[r] = it->second;
  }
  absl::MutexLock lock(&mu_);
  bodies_.resize(representative_.size());
}

std::shared_ptr<const std::string> RankViews::Body(int signature) const {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<const std::string>& body = bodies_[signature];
  if (body == nullptr) {
    absl::StatusOr<v1::RankView> view = planner::ExtractRankView(*plan_, representative_[signature]);
    // The representative is in range by construction, so this cannot fail.
    if (view.ok()) view->clear_rank();
    body = std::make_shared<const std::string>(view.ok() ? view->SerializeAsString() : "");
  }
  return body;
}

absl::StatusOr<SerializedPieces> RankViews::Response(int rank) const {
  if (rank < 0 || rank >= plan_->ranks_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the plan's world of ", plan_->ranks_size()));
  }
  std::shared_ptr<const std::string> body = Body(signature_of_rank_[rank]);
  auto rank_field = std::make_shared<const std::string>(Field(v1::RankView::kRankFieldNumber, WithNames(*plan_, rank)));
  auto header = std::make_shared<const std::string>(
      FieldHeader(v1::GetPlanResponse::kRankViewFieldNumber, body->size() + rank_field->size()));
  return SerializedPieces{info_field_, std::move(header), std::move(body), std::move(rank_field)};
}

}  // namespace muonshard::coordinator
