// Opening, loading and verifying a checkpoint through FaultInjectionEnv,
// failed at every one of the reader's file-system calls in turn (EIO, and a
// short read wherever it reads): always DATA_LOSS naming the file or
// directory, never wrong values or a crash; and the checkpoint on disk,
// untouched by a reader, loads again once the device recovers.
#include <cerrno>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "checkpoint/verify.h"
#include "checkpoint/writer.h"
#include "common/env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/testing/fault_injection_env.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::checkpoint {
namespace {

using ::muonshard::testing::DescribeCall;
using ::muonshard::testing::FaultInjectionEnv;
using ::muonshard::testing::FaultKind;
using ::muonshard::testing::FsCall;
using ::muonshard::testing::FsOp;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kWorld = 2;

struct ReadFault {
  const char* name;
  FaultKind kind;
};

void PrintTo(const ReadFault& f, std::ostream* os) { *os << f.name; }

class CheckpointLoadFaultTest : public ::testing::TestWithParam<ReadFault> {
 protected:
  void SetUp() override {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(p_, testing::MakePlan(testing::SmallDenseManifest(), kWorld));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(state_, testing::SyntheticState(p_.plan));
    // 16 KiB chunks: the larger pieces span several (a few hundred reads in
    // all, each failed in turn).
    WriteOptions write;
    write.checksum_chunk_bytes = 16 << 10;
    MUONSHARD_ASSERT_OK(SaveCheckpoint(dir_.path(), 10, p_.plan, p_.request, testing::ShardLists(state_),
                                       testing::SyntheticScalars(10), write));
  }

  // What a restoring job and `ckpt inspect` do: open `latest`, load every
  // rank (checking the values), verify every byte.
  absl::Status OpenLoadVerify(Env* env) {
    OpenOptions options;
    options.env = env;
    absl::StatusOr<Checkpoint> c = OpenCheckpoint(dir_.path(), std::nullopt, options);
    if (!c.ok()) return c.status();
    for (int r = 0; r < kWorld; ++r) {
      absl::StatusOr<std::unique_ptr<testing::RankBuffers>> rank = testing::AllocateRank(p_.plan, r);
      if (!rank.ok()) return rank.status();
      absl::Status s = LoadRankState(*c, (*rank)->shards).status();
      if (!s.ok()) return s;
      // A load that succeeds holds the saved values, whatever the device did.
      s = testing::CheckSynthetic(**rank);
      if (!s.ok()) return absl::InternalError(absl::StrCat("loaded wrong values: ", s.message()));
    }
    return VerifyCheckpoint(*c).status();
  }

  testing::ScratchDir dir_;
  testing::ScratchDir trash_;
  testing::PlanAndRequest p_;
  std::vector<std::unique_ptr<testing::RankBuffers>> state_;
};

TEST_P(CheckpointLoadFaultTest, EveryCallOfALoad_IsDataLossNamingTheFile) {
  std::vector<FsCall> calls;
  {
    FaultInjectionEnv env(Env::Default(), trash_.Sub("t"));
    MUONSHARD_ASSERT_OK(OpenLoadVerify(&env));
    calls = env.calls();
  }
  int cases = 0;
  for (int i = 1; i <= static_cast<int>(calls.size()); ++i) {
    const FsCall& call = calls[i - 1];
    const bool read = call.op == FsOp::kRead || call.op == FsOp::kReadFile;
    if (GetParam().kind == FaultKind::kShortRead && !read) continue;
    SCOPED_TRACE(absl::StrCat(GetParam().name, " at call ", i, " of ", calls.size(), ": ", DescribeCall(call)));
    FaultInjectionEnv env(Env::Default(), trash_.Sub("t"));
    env.AddRule({GetParam().kind, EIO, std::nullopt, "", i});
    EXPECT_THAT(OpenLoadVerify(&env), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(dir_.path())));
    EXPECT_EQ(env.injected(), 1);
    ++cases;
    if (HasFailure()) break;
  }
  EXPECT_GT(cases, 10);
  // Readers change nothing: the device back, the checkpoint loads.
  MUONSHARD_EXPECT_OK(OpenLoadVerify(Env::Default()));
}

INSTANTIATE_TEST_SUITE_P(Faults, CheckpointLoadFaultTest,
                         ::testing::Values(ReadFault{"Eio", FaultKind::kError},
                                           ReadFault{"ShortRead", FaultKind::kShortRead}),
                         [](const ::testing::TestParamInfo<ReadFault>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace muonshard::checkpoint
