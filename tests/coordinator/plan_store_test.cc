// PlanStore conformance: one suite, run against the in-memory store and the
// SQLite store; then what only a durable store can do (reopen, locking,
// corruption).
#include "coordinator/plan_store.h"

#include <sqlite3.h>

#include <functional>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "coordinator/sqlite_plan_store.h"
#include "coordinator/store_health.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace muonshard::coordinator {
namespace {

using ::muonshard::testing::DenseManifest;
using ::muonshard::testing::IsOk;
using ::muonshard::testing::MakeRequest;
using ::muonshard::testing::StatusIs;
using ::muonshard::testing::TempDir;
using ::testing::HasSubstr;

struct Stored {
  v1::PlanVersionInfo info;
  v1::PlanRequest request;
  v1::Plan plan;
};

// A canonical request and its plan; `world` varies the content hash.
Stored MakeStored(int world, int layers = 2) {
  Stored s;
  auto canonical = planner::CanonicalizeRequest(MakeRequest(DenseManifest(layers, 256, 512, 1000), world));
  EXPECT_THAT(canonical.status(), IsOk());
  s.request = *canonical;
  auto plan = planner::ComputePlan(s.request);
  EXPECT_THAT(plan.status(), IsOk());
  s.plan = *plan;
  s.info.set_content_hash(planner::ContentHash(s.request));
  s.info.set_model(s.plan.model());
  s.info.set_create_time_micros(1234);
  s.info.set_tensors(s.plan.tensors_size());
  return s;
}

struct StoreFactory {
  const char* name;
  std::function<std::unique_ptr<PlanStore>(const std::string& dir)> open;
};

class PlanStoreConformanceTest : public ::testing::TestWithParam<StoreFactory> {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    store_ = GetParam().open(dir_.path());
    ASSERT_NE(store_, nullptr);
  }

  PlanStore::PutResult MustPut(const Stored& s) {
    auto r = store_->Put(s.info, s.request, s.plan);
    EXPECT_THAT(r.status(), IsOk());
    return r.ok() ? *r : PlanStore::PutResult{};
  }

  TempDir dir_;
  std::unique_ptr<PlanStore> store_;
};

TEST_P(PlanStoreConformanceTest, Put_NewHashes_AssignsVersionsFromOneUpwards) {
  EXPECT_EQ(MustPut(MakeStored(2)).info.version(), 1);
  EXPECT_EQ(MustPut(MakeStored(3)).info.version(), 2);
  PlanStore::PutResult third = MustPut(MakeStored(4));
  EXPECT_EQ(third.info.version(), 3);
  EXPECT_TRUE(third.created);
  EXPECT_GT(third.info.stored_bytes(), 0);
}

TEST_P(PlanStoreConformanceTest, Put_SameHash_ReturnsExistingVersionUncreated) {
  Stored s = MakeStored(2);
  MustPut(s);
  MustPut(MakeStored(3));
  PlanStore::PutResult again = MustPut(s);
  EXPECT_FALSE(again.created);
  EXPECT_EQ(again.info.version(), 1);
  EXPECT_EQ(again.info.content_hash(), s.info.content_hash());
}

TEST_P(PlanStoreConformanceTest, Put_EmptyHash_InvalidArgument) {
  Stored s = MakeStored(2);
  s.info.clear_content_hash();
  EXPECT_THAT(store_->Put(s.info, s.request, s.plan).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hash")));
}

TEST_P(PlanStoreConformanceTest, GetPlanAndRequest_RoundTripByteExact) {
  Stored s = MakeStored(4, 3);
  const int64_t v = MustPut(s).info.version();
  auto plan = store_->GetPlan(v);
  ASSERT_THAT(plan.status(), IsOk());
  EXPECT_EQ(SerializeDeterministic(*plan), SerializeDeterministic(s.plan));
  auto request = store_->GetRequest(v);
  ASSERT_THAT(request.status(), IsOk());
  EXPECT_EQ(SerializeDeterministic(*request), SerializeDeterministic(s.request));
}

TEST_P(PlanStoreConformanceTest, GetPlan_UnknownVersion_NotFound) {
  MustPut(MakeStored(2));
  EXPECT_THAT(store_->GetPlan(2).status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("version 2")));
  EXPECT_THAT(store_->GetRequest(0).status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("0")));
}

TEST_P(PlanStoreConformanceTest, ListVersions_OldestFirstWithMetadata) {
  auto empty = store_->ListVersions();
  ASSERT_THAT(empty.status(), IsOk());
  EXPECT_TRUE(empty->empty());
  Stored a = MakeStored(2);
  Stored b = MakeStored(5);
  MustPut(a);
  MustPut(b);
  auto list = store_->ListVersions();
  ASSERT_THAT(list.status(), IsOk());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].version(), 1);
  EXPECT_EQ((*list)[0].content_hash(), a.info.content_hash());
  EXPECT_EQ((*list)[1].version(), 2);
  EXPECT_EQ((*list)[1].content_hash(), b.info.content_hash());
  EXPECT_EQ((*list)[1].model(), b.plan.model());
  EXPECT_EQ((*list)[1].create_time_micros(), 1234);
  EXPECT_GT((*list)[1].stored_bytes(), 0);
}

TEST_P(PlanStoreConformanceTest, Generation_UnsavedIsZeroAndSavedIsReturned) {
  EXPECT_EQ(*store_->LoadGeneration("job-a"), 0);
  ASSERT_THAT(store_->SaveGeneration("job-a", 3), IsOk());
  ASSERT_THAT(store_->SaveGeneration("job-a", 4), IsOk());
  ASSERT_THAT(store_->SaveGeneration("job-b", 1), IsOk());
  EXPECT_EQ(*store_->LoadGeneration("job-a"), 4);
  EXPECT_EQ(*store_->LoadGeneration("job-b"), 1);
}

TEST_P(PlanStoreConformanceTest, ProbeWrite_Repeatedly_SucceedsAndChangesNothingReadable) {
  MustPut(MakeStored(2));
  for (int i = 0; i < 3; ++i) ASSERT_THAT(store_->ProbeWrite(), IsOk());
  auto list = store_->ListVersions();
  ASSERT_THAT(list.status(), IsOk());
  EXPECT_EQ(list->size(), 1u);
  EXPECT_EQ(*store_->LoadGeneration("job-a"), 0);
}

TEST_P(PlanStoreConformanceTest, Put_ConcurrentDistinctRequests_GetDistinctConsecutiveVersions) {
  constexpr int kThreads = 4;
  std::vector<Stored> inputs;
  for (int i = 0; i < kThreads; ++i) inputs.push_back(MakeStored(2 + i));
  std::vector<int64_t> versions(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto r = store_->Put(inputs[i].info, inputs[i].request, inputs[i].plan);
      versions[i] = r.ok() ? r->info.version() : -1;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(std::set<int64_t>(versions.begin(), versions.end()), (std::set<int64_t>{1, 2, 3, 4}));
}

std::unique_ptr<PlanStore> OpenSqlite(const std::string& dir) {
  auto store = SqlitePlanStore::Open(dir + "/data");
  EXPECT_THAT(store.status(), IsOk());
  return store.ok() ? std::move(*store) : nullptr;
}

INSTANTIATE_TEST_SUITE_P(
    Stores, PlanStoreConformanceTest,
    ::testing::Values(StoreFactory{"InMemory", [](const std::string&) { return NewInMemoryPlanStore(); }},
                      StoreFactory{"Sqlite", OpenSqlite}),
    [](const ::testing::TestParamInfo<StoreFactory>& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------- SQLite only

class SqlitePlanStoreTest : public ::testing::Test {
 protected:
  std::string data_dir() const { return dir_.Join("nested/data"); }
  TempDir dir_;
};

TEST_F(SqlitePlanStoreTest, Reopen_KeepsEveryVersionAndContinuesNumbering) {
  Stored a = MakeStored(2);
  Stored b = MakeStored(3);
  {
    auto store = SqlitePlanStore::Open(data_dir());
    ASSERT_THAT(store.status(), IsOk());
    ASSERT_THAT((*store)->Put(a.info, a.request, a.plan).status(), IsOk());
    ASSERT_THAT((*store)->Put(b.info, b.request, b.plan).status(), IsOk());
    ASSERT_THAT((*store)->SaveGeneration("job", 7), IsOk());
  }
  auto store = SqlitePlanStore::Open(data_dir());
  ASSERT_THAT(store.status(), IsOk());
  auto list = (*store)->ListVersions();
  ASSERT_THAT(list.status(), IsOk());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[1].content_hash(), b.info.content_hash());
  auto plan = (*store)->GetPlan(2);
  ASSERT_THAT(plan.status(), IsOk());
  EXPECT_EQ(SerializeDeterministic(*plan), SerializeDeterministic(b.plan));
  EXPECT_EQ(*(*store)->LoadGeneration("job"), 7);
  // The same request is still version 1; a new one is 3.
  auto again = (*store)->Put(a.info, a.request, a.plan);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->info.version(), 1);
  EXPECT_FALSE(again->created);
  Stored c = MakeStored(4);
  auto next = (*store)->Put(c.info, c.request, c.plan);
  ASSERT_THAT(next.status(), IsOk());
  EXPECT_EQ(next->info.version(), 3);
}

TEST_F(SqlitePlanStoreTest, Open_DirectoryHeldByAnotherStore_FailedPrecondition) {
  auto first = SqlitePlanStore::Open(data_dir());
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_THAT(SqlitePlanStore::Open(data_dir()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("in use")));
}

// Opens the database directly, as an operator with the sqlite3 CLI would.
class RawDb {
 public:
  explicit RawDb(const std::string& path) { sqlite3_open(path.c_str(), &db_); }
  ~RawDb() { sqlite3_close(db_); }
  int Exec(const char* sql) { return sqlite3_exec(db_, sql, nullptr, nullptr, nullptr); }
  std::string Text(const char* sql) {
    std::string out;
    sqlite3_exec(
        db_, sql,
        [](void* o, int, char** values, char**) {
          *static_cast<std::string*>(o) = values[0] != nullptr ? values[0] : "";
          return 0;
        },
        &out, nullptr);
    return out;
  }

 private:
  sqlite3* db_ = nullptr;
};

TEST_F(SqlitePlanStoreTest, Open_UsesWalJournalAndAutoincrementVersions) {
  { ASSERT_THAT(SqlitePlanStore::Open(data_dir()).status(), IsOk()); }
  RawDb db(data_dir() + "/coordinator.db");
  EXPECT_EQ(db.Text("PRAGMA journal_mode"), "wal");
  EXPECT_THAT(db.Text("SELECT sql FROM sqlite_master WHERE name='plans'"), HasSubstr("AUTOINCREMENT"));
}

TEST_F(SqlitePlanStoreTest, DeletedNewestVersion_IsNeverHandedOutAgain) {
  Stored a = MakeStored(2);
  Stored b = MakeStored(3);
  {
    auto store = SqlitePlanStore::Open(data_dir());
    ASSERT_THAT(store.status(), IsOk());
    ASSERT_THAT((*store)->Put(a.info, a.request, a.plan).status(), IsOk());
    ASSERT_THAT((*store)->Put(b.info, b.request, b.plan).status(), IsOk());
  }
  {
    RawDb db(data_dir() + "/coordinator.db");
    ASSERT_EQ(db.Exec("DELETE FROM plans WHERE version=2"), SQLITE_OK);
  }
  auto store = SqlitePlanStore::Open(data_dir());
  ASSERT_THAT(store.status(), IsOk());
  auto again = (*store)->Put(b.info, b.request, b.plan);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->info.version(), 3);
}

// SQLite itself refusing the writes (triggers that abort them, added over a
// second connection while the store is open, as a full disk would fail the
// commits; file modes would not do, root ignores them): the store reports
// unhealthy until a write commits again.
TEST_F(SqlitePlanStoreTest, WritesRefusedBySqlite_UnhealthyUntilAProbeCommits) {
  auto sqlite = SqlitePlanStore::Open(data_dir());
  ASSERT_THAT(sqlite.status(), IsOk());
  CoordinatorObserver ignore;
  HealthTrackingPlanStore store(sqlite->get(), &ignore);
  ASSERT_THAT(store.ProbeWrite(), IsOk());
  RawDb db(data_dir() + "/coordinator.db");
  for (const char* table : {"plans", "job_generations", "write_probe"}) {
    for (const char* op : {"INSERT", "UPDATE"}) {
      ASSERT_EQ(db.Exec(absl::StrCat("CREATE TRIGGER fail_", op, "_", table, " BEFORE ", op, " ON ", table,
                                     " BEGIN SELECT RAISE(ABORT, 'refused'); END")
                            .c_str()),
                SQLITE_OK);
    }
  }
  Stored a = MakeStored(2);
  EXPECT_THAT(store.Put(a.info, a.request, a.plan).status(),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("refused")));
  EXPECT_FALSE(store.healthy());
  EXPECT_THAT(store.SaveGeneration("job", 2), StatusIs(absl::StatusCode::kInternal, HasSubstr("refused")));
  EXPECT_THAT(store.ProbeWrite(), StatusIs(absl::StatusCode::kInternal, HasSubstr("refused")));
  EXPECT_FALSE(store.healthy());
  ASSERT_THAT(store.ListVersions().status(), IsOk());  // reads still work

  for (const char* table : {"plans", "job_generations", "write_probe"}) {
    for (const char* op : {"INSERT", "UPDATE"}) {
      ASSERT_EQ(db.Exec(absl::StrCat("DROP TRIGGER fail_", op, "_", table).c_str()), SQLITE_OK);
    }
  }
  ASSERT_THAT(store.ProbeWrite(), IsOk());
  EXPECT_TRUE(store.healthy());
  ASSERT_THAT(store.Put(a.info, a.request, a.plan).status(), IsOk());
}

TEST_F(SqlitePlanStoreTest, GetPlan_CorruptBlob_DataLoss) {
  Stored a = MakeStored(2);
  {
    auto store = SqlitePlanStore::Open(data_dir());
    ASSERT_THAT(store.status(), IsOk());
    ASSERT_THAT((*store)->Put(a.info, a.request, a.plan).status(), IsOk());
  }
  {
    RawDb db(data_dir() + "/coordinator.db");
    ASSERT_EQ(db.Exec("UPDATE plans SET plan = x'4d535a310500000000000000deadbeef'"), SQLITE_OK);
  }
  auto store = SqlitePlanStore::Open(data_dir());
  ASSERT_THAT(store.status(), IsOk());
  EXPECT_THAT((*store)->GetPlan(1).status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("plan version 1")));
}

}  // namespace
}  // namespace muonshard::coordinator
