#include "coordinator/sqlite_plan_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "coordinator/blob_codec.h"

namespace muonshard::coordinator {
namespace {

constexpr int kSchemaVersion = 1;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS plans (
  version INTEGER PRIMARY KEY AUTOINCREMENT,
  content_hash TEXT NOT NULL UNIQUE,
  create_time_micros INTEGER NOT NULL,
  info BLOB NOT NULL,     -- PlanVersionInfo without its version
  request BLOB NOT NULL,  -- blob_codec(canonical PlanRequest)
  plan BLOB NOT NULL      -- blob_codec(Plan)
);
CREATE TABLE IF NOT EXISTS job_generations (
  job TEXT PRIMARY KEY,
  generation INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS write_probe (  -- ProbeWrite's one row; no reader
  id INTEGER PRIMARY KEY CHECK (id = 1),
  writes INTEGER NOT NULL
);
)sql";

absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what) {
  std::string msg = absl::StrCat("sqlite ", what, ": ", sqlite3_errstr(rc));
  if (db != nullptr) absl::StrAppend(&msg, " (", sqlite3_errmsg(db), ")");
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_FULL:
    case SQLITE_IOERR:
      return absl::UnavailableError(msg);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// One prepared statement, finalized on destruction.
class Statement {
 public:
  static absl::StatusOr<Statement> Prepare(sqlite3* db, const char* sql) {
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr);
    if (rc != SQLITE_OK) return SqliteError(db, rc, "prepare");
    return Statement(db, stmt);
  }
  Statement(Statement&& other) noexcept : db_(other.db_), stmt_(other.stmt_) { other.stmt_ = nullptr; }
  Statement& operator=(Statement&&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  void Bind(int index, int64_t v) { sqlite3_bind_int64(stmt_, index, v); }
  void Bind(int index, const std::string& text) {
    sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()), SQLITE_STATIC);
  }
  void BindBlob(int index, const std::string& blob) {
    sqlite3_bind_blob64(stmt_, index, blob.data(), blob.size(), SQLITE_STATIC);
  }

  // True when a row is available, false when the statement is done.
  absl::StatusOr<bool> Step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc, "step");
  }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  absl::string_view Blob(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    int n = sqlite3_column_bytes(stmt_, col);
    return p == nullptr ? absl::string_view() : absl::string_view(static_cast<const char*>(p), n);
  }

 private:
  Statement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  sqlite3* db_;
  sqlite3_stmt* stmt_;
};

absl::Status Exec(sqlite3* db, const char* sql) {
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db, rc, sql);
  return absl::OkStatus();
}

// Rolls back unless committed; keeps a failed Put from leaving a transaction open.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {}
  ~Transaction() {
    if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  absl::Status Begin() {
    MUONSHARD_RETURN_IF_ERROR(Exec(db_, "BEGIN IMMEDIATE"));
    open_ = true;
    return absl::OkStatus();
  }
  absl::Status Commit() {
    MUONSHARD_RETURN_IF_ERROR(Exec(db_, "COMMIT"));
    open_ = false;
    return absl::OkStatus();
  }

 private:
  sqlite3* db_;
  bool open_ = false;
};

absl::Status MakeDirs(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string prefix = dir.substr(0, pos);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InternalError(absl::StrCat("mkdir ", prefix, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> LockDirectory(const std::string& dir) {
  const std::string path = dir + "/LOCK";
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("data dir ", dir, " is in use by another coordinator (", path, " is locked)"));
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqlitePlanStore>> SqlitePlanStore::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("data dir is empty");
  MUONSHARD_RETURN_IF_ERROR(MakeDirs(dir));
  MUONSHARD_ASSIGN_OR_RETURN(int lock_fd, LockDirectory(dir));
  const std::string path = dir + "/coordinator.db";
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = SqliteError(db, rc, absl::StrCat("open ", path));
    sqlite3_close(db);
    close(lock_fd);
    return s;
  }
  std::unique_ptr<SqlitePlanStore> store(new SqlitePlanStore(db, lock_fd));
  absl::MutexLock lock(&store->mu_);
  MUONSHARD_RETURN_IF_ERROR(Annotate(store->InitSchema(), path));
  return store;
}

SqlitePlanStore::~SqlitePlanStore() {
  sqlite3_close(db_);
  close(lock_fd_);
}

absl::Status SqlitePlanStore::InitSchema() {
  // WAL + FULL: a commit is fsynced to the WAL before COMMIT returns, so a
  // reply sent after Put survives kill -9 and power loss alike. Submits are
  // rare, so the extra fsync per commit costs nothing that matters.
  MUONSHARD_RETURN_IF_ERROR(Exec(db_, "PRAGMA journal_mode=WAL"));
  MUONSHARD_RETURN_IF_ERROR(Exec(db_, "PRAGMA synchronous=FULL"));
  sqlite3_busy_timeout(db_, 5000);
  MUONSHARD_ASSIGN_OR_RETURN(Statement version, Statement::Prepare(db_, "PRAGMA user_version"));
  MUONSHARD_ASSIGN_OR_RETURN(bool row, version.Step());
  const int64_t found = row ? version.Int(0) : 0;
  if (found > kSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("schema version ", found, " is newer than this coordinator's (", kSchemaVersion, ")"));
  }
  MUONSHARD_RETURN_IF_ERROR(Exec(db_, kSchema));
  return Exec(db_, "PRAGMA user_version=1");
}

absl::StatusOr<std::optional<v1::PlanVersionInfo>> SqlitePlanStore::FindByHash(const std::string& hash) {
  MUONSHARD_ASSIGN_OR_RETURN(Statement q,
                             Statement::Prepare(db_, "SELECT version, info FROM plans WHERE content_hash=?"));
  q.Bind(1, hash);
  MUONSHARD_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::nullopt;
  v1::PlanVersionInfo info;
  if (!info.ParseFromArray(q.Blob(1).data(), static_cast<int>(q.Blob(1).size()))) {
    return absl::DataLossError(absl::StrCat("plan version ", q.Int(0), ": corrupt info"));
  }
  info.set_version(q.Int(0));
  return info;
}

absl::StatusOr<PlanStore::PutResult> SqlitePlanStore::Put(v1::PlanVersionInfo info, const v1::PlanRequest& canonical,
                                                          const v1::Plan& plan) {
  if (info.content_hash().empty()) return absl::InvalidArgumentError("empty content hash");
  // Compress outside the lock: it is the slow part for big plans.
  const std::string request_blob = EncodeBlob(canonical);
  const std::string plan_blob = EncodeBlob(plan);
  info.set_version(0);
  info.set_stored_bytes(static_cast<int64_t>(request_blob.size() + plan_blob.size()));
  const std::string info_bytes = SerializeDeterministic(info);

  absl::MutexLock lock(&mu_);
  Transaction txn(db_);
  MUONSHARD_RETURN_IF_ERROR(txn.Begin());
  MUONSHARD_ASSIGN_OR_RETURN(std::optional<v1::PlanVersionInfo> existing, FindByHash(info.content_hash()));
  if (existing) {
    MUONSHARD_RETURN_IF_ERROR(txn.Commit());
    return PutResult{*std::move(existing), false};
  }
  MUONSHARD_ASSIGN_OR_RETURN(
      Statement insert, Statement::Prepare(db_,
                                           "INSERT INTO plans (content_hash, create_time_micros, info, request, plan)"
                                           " VALUES (?, ?, ?, ?, ?)"));
  insert.Bind(1, info.content_hash());
  insert.Bind(2, info.create_time_micros());
  insert.BindBlob(3, info_bytes);
  insert.BindBlob(4, request_blob);
  insert.BindBlob(5, plan_blob);
  MUONSHARD_RETURN_IF_ERROR(insert.Step().status());
  info.set_version(sqlite3_last_insert_rowid(db_));
  MUONSHARD_RETURN_IF_ERROR(txn.Commit());
  return PutResult{std::move(info), true};
}

absl::Status SqlitePlanStore::ReadBlob(int64_t version, const char* column, google::protobuf::Message* out) {
  std::string blob;
  {
    absl::MutexLock lock(&mu_);
    MUONSHARD_ASSIGN_OR_RETURN(
        Statement q, Statement::Prepare(db_, absl::StrCat("SELECT ", column, " FROM plans WHERE version=?").c_str()));
    q.Bind(1, version);
    MUONSHARD_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return absl::NotFoundError(absl::StrCat("plan version ", version, " does not exist"));
    blob = std::string(q.Blob(0));
  }
  // Decompress outside the lock so one big read does not stall the others.
  return DecodeBlob(blob, out, absl::StrCat("plan version ", version, " ", column));
}

absl::StatusOr<v1::Plan> SqlitePlanStore::GetPlan(int64_t version) {
  v1::Plan plan;
  MUONSHARD_RETURN_IF_ERROR(ReadBlob(version, "plan", &plan));
  return plan;
}

absl::StatusOr<v1::PlanRequest> SqlitePlanStore::GetRequest(int64_t version) {
  v1::PlanRequest request;
  MUONSHARD_RETURN_IF_ERROR(ReadBlob(version, "request", &request));
  return request;
}

absl::StatusOr<std::vector<v1::PlanVersionInfo>> SqlitePlanStore::ListVersions() {
  absl::MutexLock lock(&mu_);
  MUONSHARD_ASSIGN_OR_RETURN(Statement q, Statement::Prepare(db_, "SELECT version, info FROM plans ORDER BY version"));
  std::vector<v1::PlanVersionInfo> out;
  while (true) {
    MUONSHARD_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    v1::PlanVersionInfo& info = out.emplace_back();
    absl::string_view bytes = q.Blob(1);
    if (!info.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return absl::DataLossError(absl::StrCat("plan version ", q.Int(0), ": corrupt info"));
    }
    info.set_version(q.Int(0));
  }
  return out;
}

absl::StatusOr<int64_t> SqlitePlanStore::LoadGeneration(const std::string& job) {
  absl::MutexLock lock(&mu_);
  MUONSHARD_ASSIGN_OR_RETURN(Statement q,
                             Statement::Prepare(db_, "SELECT generation FROM job_generations WHERE job=?"));
  q.Bind(1, job);
  MUONSHARD_ASSIGN_OR_RETURN(bool row, q.Step());
  return row ? q.Int(0) : 0;
}

absl::Status SqlitePlanStore::SaveGeneration(const std::string& job, int64_t generation) {
  absl::MutexLock lock(&mu_);
  MUONSHARD_ASSIGN_OR_RETURN(Statement q,
                             Statement::Prepare(db_,
                                                "INSERT INTO job_generations (job, generation) VALUES (?, ?) "
                                                "ON CONFLICT(job) DO UPDATE SET generation=excluded.generation"));
  q.Bind(1, job);
  q.Bind(2, generation);
  return q.Step().status();
}

absl::Status SqlitePlanStore::ProbeWrite() {
  // A counter, not a constant: every probe then changes a page, so the
  // commit appends to the WAL and fsyncs like a real write.
  absl::MutexLock lock(&mu_);
  MUONSHARD_ASSIGN_OR_RETURN(Statement q, Statement::Prepare(db_,
                                                             "INSERT INTO write_probe (id, writes) VALUES (1, 1) "
                                                             "ON CONFLICT(id) DO UPDATE SET writes=writes+1"));
  return q.Step().status();
}

}  // namespace muonshard::coordinator
