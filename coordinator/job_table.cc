#include "coordinator/job_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/quote.h"

namespace muonshard::coordinator {

absl::StatusOr<Job*> JobTable::Find(const std::string& name) const {
  Job* job = FindOrNull(name);
  if (job == nullptr)
    // A lookup's name was never length-checked: quote a bounded prefix.
    return absl::NotFoundError(absl::StrCat("job ", QuoteBounded(name), " does not exist"));
  return job;
}

Job* JobTable::FindOrNull(const std::string& name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : it->second.get();
}

absl::Status JobTable::CheckRoom() const {
  if (static_cast<int64_t>(jobs_.size()) < options_->max_jobs) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("this coordinator already tracks ", jobs_.size(), " jobs (--max-jobs)"));
}

Job* JobTable::Add(const std::string& name, int64_t generation, int64_t base_revision, std::string reason) {
  auto job = std::make_unique<Job>(name);
  job->generation = generation;
  job->generation_reason = std::move(reason);
  job->history.base_revision = base_revision;
  job->history.revision = base_revision;
  job->kv = std::make_unique<RendezvousKv>(options_);
  Job* raw = job.get();
  jobs_[name] = std::move(job);
  return raw;
}

std::vector<const Job*> JobTable::Sorted() const {
  std::vector<const Job*> all;
  all.reserve(jobs_.size());
  for (const auto& [name, job] : jobs_) all.push_back(job.get());
  std::sort(all.begin(), all.end(), [](const Job* a, const Job* b) { return a->name < b->name; });
  return all;
}

}  // namespace muonshard::coordinator
