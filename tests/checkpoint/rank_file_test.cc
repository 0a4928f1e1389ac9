// Checksum-verified partial reads: every element-aligned [offset, end) of a
// piece reads back exactly, and a damaged byte fails exactly the reads whose
// checksum chunks contain it.
#include "checkpoint/internal/rank_file.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/internal/checksums.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::checkpoint::internal {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kDataOffset = 16;  // bytes before the piece
constexpr int64_t kElements = 61;
constexpr int64_t kChunk = 24;  // 6 floats; the last chunk is short

class ReadVerifiedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.Sub("piece.bin");
    std::string bytes(kDataOffset, 'x');
    for (int64_t i = 0; i < kElements; ++i) values_.push_back(1.0f + static_cast<float>(i));
    bytes.append(reinterpret_cast<const char*>(values_.data()), values_.size() * 4);
    bytes.append(8, 'y');
    MUONSHARD_ASSERT_OK(testing::WriteAll(path_, bytes));
    piece_.set_key("w/master/0-61");
    piece_.set_begin(0);
    piece_.set_end(kElements);
    piece_.set_data_offset(kDataOffset);
    const char* data = bytes.data() + kDataOffset;
    for (int64_t at = 0; at < kElements * 4; at += kChunk) {
      piece_.add_chunk_crc32(Crc32(0, data + at, std::min(kChunk, kElements * 4 - at)));
    }
  }

  absl::StatusOr<std::vector<float>> Read(int64_t first, int64_t last) {
    MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, Env::Default()->NewRandomAccessFile(path_));
    std::vector<float> out(static_cast<size_t>(last - first), -1.0f);
    std::vector<char> scratch;
    auto n = ReadVerified(*file, piece_, kChunk, first * 4, (last - first) * 4, reinterpret_cast<char*>(out.data()),
                          &scratch);
    if (!n.ok()) return n.status();
    // Reads are widened to whole chunks, never more.
    const int64_t widened =
        std::min(kElements * 4, (last * 4 + kChunk - 1) / kChunk * kChunk) - first * 4 / kChunk * kChunk;
    if (last > first && *n != widened) return absl::InternalError(absl::StrCat("read ", *n, " bytes, not ", widened));
    return out;
  }

  testing::ScratchDir dir_;
  std::string path_;
  std::vector<float> values_;
  v1::StatePiece piece_;
};

TEST_F(ReadVerifiedTest, EveryRange_ReadsBackExactly) {
  for (int64_t first = 0; first <= kElements; ++first) {
    for (int64_t last = first; last <= kElements; ++last) {
      MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<float> got, Read(first, last));
      ASSERT_EQ(got, std::vector<float>(values_.begin() + first, values_.begin() + last)) << first << ".." << last;
    }
  }
}

TEST_F(ReadVerifiedTest, DamagedByte_FailsExactlyTheReadsOfItsChunk) {
  const int64_t damaged = 29;  // element 29 lies in chunk 4 (elements 24..29)
  MUONSHARD_ASSERT_OK(testing::FlipByte(path_, kDataOffset + damaged * 4 + 1));
  for (int64_t first = 0; first < kElements; ++first) {
    for (int64_t last = first + 1; last <= kElements; ++last) {
      const bool touches = first / 6 <= 4 && (last - 1) / 6 >= 4;
      if (touches) {
        EXPECT_THAT(Read(first, last),
                    StatusIs(absl::StatusCode::kDataLoss, HasSubstr("crc32 mismatch in bytes [96, 120)")))
            << first << ".." << last;
      } else {
        MUONSHARD_EXPECT_OK(Read(first, last).status()) << first << ".." << last;
      }
    }
  }
}

TEST_F(ReadVerifiedTest, TruncatedFile_IsDataLoss) {
  MUONSHARD_ASSERT_OK(testing::TruncateFile(path_, kDataOffset + 100));
  EXPECT_THAT(Read(0, kElements), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
}

}  // namespace
}  // namespace muonshard::checkpoint::internal
