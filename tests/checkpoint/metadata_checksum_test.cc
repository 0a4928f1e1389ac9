// The metadata of a step (index.json, plan.pb, request.pb) is covered by
// checksums.sha256 the way every state byte is covered by a chunk crc32:
// any edit, even one that leaves a well-formed index (an optimizer scalar),
// is DATA_LOSS naming the file when the step is opened, so neither a load
// (`--resume`) nor `ckpt inspect` accepts it.
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/index.h"
#include "checkpoint/internal/checksums.h"
#include "checkpoint/reader.h"
#include "checkpoint/verify.h"
#include "checkpoint/writer.h"
#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::checkpoint {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class CheckpointChecksumTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(p_, testing::MakePlan(testing::SmallDenseManifest(), 4));
    for (int64_t step : {10, 20}) {
      auto state = testing::SyntheticState(p_.plan);
      ASSERT_TRUE(state.ok());
      MUONSHARD_ASSERT_OK(SaveCheckpoint(dir_.path(), step, p_.plan, p_.request, testing::ShardLists(*state),
                                         testing::SyntheticScalars(step)));
    }
  }

  std::string StepFile(absl::string_view name) const { return dir_.Sub(absl::StrCat("step-20/", name)); }

  void ExpectPreviousIntact() {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint previous, OpenCheckpoint(dir_.path(), 10));
    MUONSHARD_EXPECT_OK(VerifyCheckpoint(previous).status());
  }

  testing::ScratchDir dir_;
  testing::PlanAndRequest p_;
};

// The case: one digit of beta1_pow changed. The index still parses
// and validates, so only a checksum of its bytes can tell.
TEST_F(CheckpointChecksumTest, EditedOptimizerScalar_IsDataLossNamingTheIndex) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string index, testing::ReadAll(StepFile("index.json")));
  const size_t key = index.find("\"beta1_pow\":0.");
  ASSERT_NE(key, std::string::npos) << index;
  char& digit = index[key + std::string("\"beta1_pow\":0.").size()];
  digit = digit == '9' ? '8' : '9';
  MUONSHARD_ASSERT_OK(testing::WriteAll(StepFile("index.json"), index));
  v1::CheckpointIndex edited;  // well-formed: nothing but the checksum can tell
  MUONSHARD_ASSERT_OK(FromJson(index, &edited, "index.json"));
  MUONSHARD_ASSERT_OK(ValidateIndex(edited));

  const auto damaged = AllOf(HasSubstr("step-20/index.json"), HasSubstr("checksums.sha256"));
  EXPECT_THAT(OpenCheckpoint(dir_.path()), StatusIs(absl::StatusCode::kDataLoss, damaged));
  EXPECT_THAT(OpenCheckpoint(dir_.path(), 20), StatusIs(absl::StatusCode::kDataLoss, damaged));
  ExpectPreviousIntact();
}

// A changed digit mostly leaves well-formed JSON (a flipped bit mostly does
// not, and parsing catches it already): sizes, offsets, crc32s, ranges,
// scalars, hyper-parameters. Sampled to a few hundred opens.
TEST_F(CheckpointChecksumTest, ChangedDigitsAnywhereInTheIndex_AreDataLoss) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string original, testing::ReadAll(StepFile("index.json")));
  std::vector<size_t> digits;
  for (size_t i = 0; i < original.size(); ++i) {
    if (original[i] >= '0' && original[i] <= '9') digits.push_back(i);
  }
  const size_t stride = std::max<size_t>(1, digits.size() / 300);
  for (size_t d = 0; d < digits.size(); d += stride) {
    std::string edited = original;
    char& c = edited[digits[d]];
    c = c == '9' ? '0' : static_cast<char>(c + 1);
    MUONSHARD_ASSERT_OK(testing::WriteAll(StepFile("index.json"), edited));
    EXPECT_THAT(OpenCheckpoint(dir_.path()), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("index.json")))
        << "byte " << digits[d] << " of " << original.size();
  }
  MUONSHARD_ASSERT_OK(testing::WriteAll(StepFile("index.json"), original));
  MUONSHARD_EXPECT_OK(OpenCheckpoint(dir_.path()).status());
}

TEST_F(CheckpointChecksumTest, EditedPlanOrRequest_IsDataLossNamingTheFile) {
  for (const char* name : {"plan.pb", "request.pb"}) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string original, testing::ReadAll(StepFile(name)));
    MUONSHARD_ASSERT_OK(testing::FlipByte(StepFile(name), static_cast<int64_t>(original.size()) / 2));
    EXPECT_THAT(OpenCheckpoint(dir_.path()),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr(absl::StrCat("step-20/", name)), HasSubstr("checksums.sha256"))));
    MUONSHARD_ASSERT_OK(testing::WriteAll(StepFile(name), original));
  }
  MUONSHARD_EXPECT_OK(OpenCheckpoint(dir_.path()).status());
}

// A step without its checksums (damaged, or saved by a build older than the
// checksums) is refused: accepting it would accept any edited index.
TEST_F(CheckpointChecksumTest, MissingChecksums_IsDataLossNamingTheFile) {
  std::filesystem::remove(StepFile("checksums.sha256"));
  EXPECT_THAT(
      OpenCheckpoint(dir_.path()),
      StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("step-20/checksums.sha256"), HasSubstr("missing"))));
  ExpectPreviousIntact();
}

// The way back for a step of an older build, as the error says: plain
// sha256sum writes the file in the very format the reader expects.
TEST_F(CheckpointChecksumTest, ChecksumsWrittenBySha256sum_AreAccepted) {
  std::filesystem::remove(StepFile("checksums.sha256"));
  const std::string command =
      absl::StrCat("cd '", dir_.Sub("step-20"), "' && sha256sum index.json plan.pb request.pb > checksums.sha256");
  const int status = std::system(command.c_str());
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) == 127) GTEST_SKIP() << "no sha256sum";
  ASSERT_EQ(WEXITSTATUS(status), 0);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint c, OpenCheckpoint(dir_.path()));
  MUONSHARD_EXPECT_OK(VerifyCheckpoint(c).status());
}

TEST_F(CheckpointChecksumTest, GarbledOrIncompleteChecksums_IsDataLoss) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string sums, testing::ReadAll(StepFile("checksums.sha256")));
  for (const std::string& bad : {std::string("not a checksum\n"), sums.substr(0, sums.size() / 2),
                                 sums.substr(0, sums.find('\n') + 1), std::string()}) {
    MUONSHARD_ASSERT_OK(testing::WriteAll(StepFile("checksums.sha256"), bad));
    EXPECT_THAT(OpenCheckpoint(dir_.path()), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksums.sha256")))
        << "\"" << bad << "\"";
  }
  ExpectPreviousIntact();
}

// sha256sum's own format: `sha256sum -c checksums.sha256` in the step
// directory checks the metadata without muonshard.
TEST_F(CheckpointChecksumTest, Checksums_AreSha256sumLinesOfTheExactBytes) {
  std::string want;
  for (const char* name : {"index.json", "plan.pb", "request.pb"}) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string bytes, testing::ReadAll(StepFile(name)));
    absl::StrAppend(&want, internal::Sha256Hex(bytes), "  ", name, "\n");
  }
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string sums, testing::ReadAll(StepFile("checksums.sha256")));
  EXPECT_EQ(sums, want);
}

}  // namespace
}  // namespace muonshard::checkpoint
