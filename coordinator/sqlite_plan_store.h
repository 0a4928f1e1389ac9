#ifndef MUONSHARD_COORDINATOR_SQLITE_PLAN_STORE_H_
#define MUONSHARD_COORDINATOR_SQLITE_PLAN_STORE_H_

// SqlitePlanStore: the embedded default PlanStore, one SQLite database
// `coordinator.db` in the data directory.
//
// Durability: WAL journal with synchronous=FULL, so a Put that returned is on
// disk even if the process is killed (or the machine loses power) right
// after. Versions are an AUTOINCREMENT primary key: SQLite never hands out a
// rowid again, even one whose row was deleted. A LOCK file (flock) keeps a
// second coordinator off the same directory.
//
// Thread-safe: one connection, serialized by a mutex (writes are rare and the
// service caches what it reads).

#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "coordinator/plan_store.h"

struct sqlite3;

namespace muonshard::coordinator {

class SqlitePlanStore final : public PlanStore {
 public:
  // Creates `dir` if needed and opens (or creates) the database in it.
  // Possible errors: FAILED_PRECONDITION (another process holds the
  // directory, or its schema is newer than this binary's), INTERNAL/
  // UNAVAILABLE (I/O or SQLite errors).
  static absl::StatusOr<std::unique_ptr<SqlitePlanStore>> Open(const std::string& dir);
  ~SqlitePlanStore() override;

  SqlitePlanStore(const SqlitePlanStore&) = delete;
  SqlitePlanStore& operator=(const SqlitePlanStore&) = delete;

  absl::StatusOr<PutResult> Put(v1::PlanVersionInfo info, const v1::PlanRequest& canonical,
                                const v1::Plan& plan) override;
  absl::StatusOr<v1::Plan> GetPlan(int64_t version) override;
  absl::StatusOr<v1::PlanRequest> GetRequest(int64_t version) override;
  absl::StatusOr<std::vector<v1::PlanVersionInfo>> ListVersions() override;
  absl::StatusOr<int64_t> LoadGeneration(const std::string& job) override;
  absl::Status SaveGeneration(const std::string& job, int64_t generation) override;
  // Bumps the one row of table write_probe in its own transaction.
  absl::Status ProbeWrite() override;

 private:
  SqlitePlanStore(sqlite3* db, int lock_fd) : db_(db), lock_fd_(lock_fd) {}

  absl::Status InitSchema() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::optional<v1::PlanVersionInfo>> FindByHash(const std::string& hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReadBlob(int64_t version, const char* column, google::protobuf::Message* out);

  absl::Mutex mu_;
  sqlite3* const db_;  // owned; closed in the destructor
  const int lock_fd_;  // owned; holds the directory's flock
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_SQLITE_PLAN_STORE_H_
