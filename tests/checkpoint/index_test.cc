// Index naming, key spelling, validation and proto3 JSON round trip.
#include "checkpoint/index.h"

#include <cmath>
#include <limits>

#include "absl/base/casts.h"
#include "checkpoint/reads.h"
#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::checkpoint {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Optional;

TEST(IndexNamesTest, StepAndRankNames) {
  EXPECT_EQ(StepDirName(100), "step-100");
  EXPECT_EQ(TempStepDirName(100), "step-100.tmp");
  EXPECT_THAT(ParseStepDirName("step-100"), Optional(100));
  EXPECT_THAT(ParseStepDirName("step-0"), Optional(0));
  EXPECT_EQ(ParseStepDirName("step-100.tmp"), std::nullopt);
  EXPECT_EQ(ParseStepDirName("step--1"), std::nullopt);
  EXPECT_EQ(ParseStepDirName("step-"), std::nullopt);
  EXPECT_EQ(ParseStepDirName("latest"), std::nullopt);
  EXPECT_EQ(ParseStepDirName("step-99999999999999999999999"), std::nullopt);
  EXPECT_EQ(RankFileName(3, 16), "rank-00003-of-00016.safetensors");
  EXPECT_EQ(RankRecordName(3, 16), "rank-00003-of-00016.json");
}

TEST(IndexNamesTest, StructuredKeys) {
  EXPECT_EQ(
      PieceKey(KeyStyle::kStructured, "model.layers.0.mlp.up_proj.weight", v1::BF16, StateKind::kMaster, 0, 1048576),
      "model.layers.0.mlp.up_proj.weight/master/0-1048576");
  EXPECT_EQ(PieceKey(KeyStyle::kStructured, "w", v1::BF16, StateKind::kMoment2, 5, 9), "w/moment2/5-9");
}

TEST(IndexNamesTest, PaddleKeys_NamedAfterTheMasterForLowPrecision) {
  EXPECT_EQ(PieceKey(KeyStyle::kPaddle, "w", v1::BF16, StateKind::kMaster, 0, 4), "w_fp32_master_0");
  EXPECT_EQ(PieceKey(KeyStyle::kPaddle, "w", v1::BF16, StateKind::kMoment1, 0, 4), "w_fp32_master_0_moment1_0");
  EXPECT_EQ(PieceKey(KeyStyle::kPaddle, "w", v1::BF16, StateKind::kMoment2, 0, 4), "w_fp32_master_0_moment2_0");
  EXPECT_EQ(PieceKey(KeyStyle::kPaddle, "w", v1::BF16, StateKind::kMomentum, 0, 4), "w_fp32_master_0_moment1_0");
  EXPECT_EQ(PaddleBetaPowKey("w", v1::BF16, 1), "w_fp32_master_0_beta1_pow_acc_0");
  // fp32 parameters have no master copy in Paddle: accumulators take the
  // parameter's own name.
  EXPECT_EQ(PieceKey(KeyStyle::kPaddle, "w", v1::FP32, StateKind::kMoment1, 0, 4), "w_moment1_0");
  EXPECT_EQ(PaddleBetaPowKey("w", v1::FP32, 2), "w_beta2_pow_acc_0");
  EXPECT_EQ(PieceKey(KeyStyle::kPaddle, "w", v1::FP32, StateKind::kMaster, 0, 4), "w_fp32_master_0");
}

TEST(IndexNamesTest, ChunkCount) {
  EXPECT_EQ(ChunkCount(0, 16), 0);
  EXPECT_EQ(ChunkCount(1, 16), 1);
  EXPECT_EQ(ChunkCount(16, 16), 1);
  EXPECT_EQ(ChunkCount(17, 16), 2);
}

// A valid two-file index: an AdamW tensor of 6 elements split 4 + 2.
v1::CheckpointIndex SmallIndex() {
  v1::CheckpointIndex index;
  index.set_format_version(kCheckpointFormatVersion);
  index.set_step(3);
  index.set_plan_hash("sha256:abc");
  index.mutable_topology()->set_world_size(2);
  index.set_checksum_chunk_bytes(8);
  index.set_key_style("structured");
  for (int r = 0; r < 2; ++r) {
    v1::CheckpointFile* f = index.add_files();
    f->set_name(RankFileName(r, 2));
    f->set_rank(r);
    f->set_size_bytes(1000);
  }
  v1::CheckpointTensor* t = index.add_tensors();
  t->set_name("norm");
  t->add_shape(6);
  t->set_numel(6);
  t->set_optimizer(v1::ADAMW);
  for (v1::StateKind kind : {v1::MASTER, v1::MOMENT1, v1::MOMENT2}) {
    v1::TensorStatePieces* s = t->add_states();
    s->set_kind(kind);
    for (int r = 0; r < 2; ++r) {
      v1::StatePiece* p = s->add_pieces();
      p->set_file(r);
      p->set_begin(r == 0 ? 0 : 4);
      p->set_end(r == 0 ? 4 : 6);
      p->set_data_offset(100 + 32 * kind);
      p->set_key("k");
      for (int c = 0; c < (r == 0 ? 2 : 1); ++c) p->add_chunk_crc32(c);
    }
  }
  return index;
}

TEST(ValidateIndexTest, SmallIndex_IsValid) { MUONSHARD_EXPECT_OK(ValidateIndex(SmallIndex())); }

TEST(ValidateIndexTest, Damage_IsDataLossNamingTheTensor) {
  v1::CheckpointIndex gap = SmallIndex();
  gap.mutable_tensors(0)->mutable_states(1)->mutable_pieces(1)->set_begin(5);
  EXPECT_THAT(ValidateIndex(gap), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("tensor \"norm\" MOMENT1")));

  v1::CheckpointIndex short_cover = SmallIndex();
  short_cover.mutable_tensors(0)->mutable_states(0)->mutable_pieces()->RemoveLast();
  EXPECT_THAT(ValidateIndex(short_cover), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("in no piece")));

  v1::CheckpointIndex bad_file = SmallIndex();
  bad_file.mutable_tensors(0)->mutable_states(2)->mutable_pieces(0)->set_file(7);
  EXPECT_THAT(ValidateIndex(bad_file), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("names file 7")));

  v1::CheckpointIndex outside = SmallIndex();
  outside.mutable_tensors(0)->mutable_states(2)->mutable_pieces(0)->set_data_offset(990);
  EXPECT_THAT(ValidateIndex(outside), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("lies outside")));

  v1::CheckpointIndex crcs = SmallIndex();
  crcs.mutable_tensors(0)->mutable_states(0)->mutable_pieces(0)->add_chunk_crc32(1);
  EXPECT_THAT(ValidateIndex(crcs), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("3 checksums")));

  v1::CheckpointIndex kinds = SmallIndex();
  kinds.mutable_tensors(0)->set_optimizer(v1::MUON);
  EXPECT_THAT(ValidateIndex(kinds), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("3 states for MUON")));

  v1::CheckpointIndex world = SmallIndex();
  world.mutable_topology()->set_world_size(3);
  EXPECT_THAT(ValidateIndex(world), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("2 files for a world of 3")));

  v1::CheckpointIndex twice = SmallIndex();
  *twice.add_tensors() = twice.tensors(0);
  EXPECT_THAT(ValidateIndex(twice), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("listed twice")));

  v1::CheckpointIndex chunk = SmallIndex();
  chunk.set_checksum_chunk_bytes(0);
  EXPECT_THAT(ValidateIndex(chunk), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum_chunk_bytes")));
}

TEST(ValidateIndexTest, NewerFormat_IsFailedPrecondition) {
  v1::CheckpointIndex index = SmallIndex();
  index.set_format_version(kCheckpointFormatVersion + 1);
  EXPECT_THAT(ValidateIndex(index), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("newer")));
}

TEST(IndexJsonTest, RoundTrip_KeepsEveryFieldAndFloatBits) {
  v1::CheckpointIndex index = SmallIndex();
  // Beta powers after many steps, subnormal and tiny values: proto3 JSON
  // must give back the very same float (resume is bit-identical).
  const float values[] = {0.9f, 0.3486784f, 1.0e-38f, std::numeric_limits<float>::denorm_min(),
                          std::nextafter(0.95f, 1.0f)};
  for (float v : values) {
    index.mutable_scalars()->set_beta1_pow(v);
    index.mutable_scalars()->set_beta2_pow(v * 0.5f);
    index.mutable_tensors(0)->mutable_states(0)->mutable_pieces(0)->set_chunk_crc32(0, 0xfedcba98u);
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string json, ToJson(index, /*pretty=*/false));
    v1::CheckpointIndex back;
    MUONSHARD_ASSERT_OK(FromJson(json, &back, "index"));
    EXPECT_EQ(SerializeDeterministic(back), SerializeDeterministic(index)) << json;
    EXPECT_EQ(absl::bit_cast<uint32_t>(back.scalars().beta1_pow()), absl::bit_cast<uint32_t>(v));
  }
}

ShardSpec Want(const std::string& name, StateKind kind, int64_t begin, int64_t end) {
  ShardSpec s;
  s.name = name;
  s.kind = kind;
  s.begin = begin;
  s.end = end;
  return s;
}

// SmallIndex's tensor as a 2 x 3 matrix saved tensor-parallel: tp 2 over
// dimension 1 would not divide 3, so dimension 0: shard t = row t, one
// piece per shard in file t.
v1::CheckpointIndex TpIndex() {
  v1::CheckpointIndex index = SmallIndex();
  v1::CheckpointTensor* t = index.mutable_tensors(0);
  t->clear_shape();
  t->add_shape(2);
  t->add_shape(3);
  t->set_tp(2);
  t->set_tp_dim(0);
  for (v1::TensorStatePieces& s : *t->mutable_states()) {
    for (int r = 0; r < 2; ++r) {
      v1::StatePiece* p = s.mutable_pieces(r);
      p->set_tp_rank(r);
      p->set_begin(0);
      p->set_end(3);
      p->clear_chunk_crc32();
      for (int c = 0; c < 2; ++c) p->add_chunk_crc32(c);  // 12 bytes in 8-byte chunks
    }
  }
  return index;
}

TEST(ValidateIndexTest, TpIndex_TilesEveryShard) { MUONSHARD_EXPECT_OK(ValidateIndex(TpIndex())); }

TEST(ValidateIndexTest, TpDamage_IsDataLossNamingTheShard) {
  v1::CheckpointIndex missing = TpIndex();
  missing.mutable_tensors(0)->mutable_states(0)->mutable_pieces()->RemoveLast();
  EXPECT_THAT(ValidateIndex(missing),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("of tp rank 0 (of 2) are in no piece")));
  v1::CheckpointIndex bad_rank = TpIndex();
  bad_rank.mutable_tensors(0)->mutable_states(1)->mutable_pieces(1)->set_tp_rank(0);
  EXPECT_THAT(ValidateIndex(bad_rank),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not continue the tiling")));
  v1::CheckpointIndex indivisible = TpIndex();
  indivisible.mutable_tensors(0)->set_tp_dim(1);
  EXPECT_THAT(ValidateIndex(indivisible),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("tp 2 does not split dimension 1")));
}

// NOTE [TP reshard]: a whole-tensor range of a TP-saved tensor reads each
// row from its shard's file; a shard wanted under another tp (here tp 3 on
// dimension 1: column 1 of both rows) reads one element of each saved shard.
TEST(ComputeReadsTest, TpSaved_ReadThroughTheWholeTensor) {
  const v1::CheckpointIndex index = TpIndex();
  IndexLookup lookup(index);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<Read> whole, ComputeReads(lookup, Want("norm", StateKind::kMaster, 1, 6)));
  ASSERT_EQ(whole.size(), 2u);
  EXPECT_EQ(whole[0].file, 0);
  EXPECT_EQ(whole[0].piece_offset, 4);  // row 0, elements 1 and 2
  EXPECT_EQ(whole[0].bytes, 8);
  EXPECT_EQ(whole[1].file, 1);
  EXPECT_EQ(whole[1].piece_offset, 0);  // row 1, all three
  EXPECT_EQ(whole[1].bytes, 12);
  EXPECT_EQ(whole[1].dest_element, 2);
  ShardSpec column = Want("norm", StateKind::kMaster, 0, 2);
  column.tp = 3;
  column.tp_rank = 1;
  column.tp_dim = 1;
  column.shape = {2, 3};
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<Read> reads, ComputeReads(lookup, column));
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].file, 0);
  EXPECT_EQ(reads[0].piece_offset, 4);  // (0, 1)
  EXPECT_EQ(reads[0].bytes, 4);
  EXPECT_EQ(reads[1].file, 1);
  EXPECT_EQ(reads[1].piece_offset, 4);  // (1, 1)
  EXPECT_EQ(reads[1].dest_element, 1);
  column.shape = {3, 2};
  EXPECT_THAT(ComputeReads(lookup, column), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("another shape")));
}

TEST(ComputeReadsTest, RangeAcrossTwoPieces_OneReadPerPiece) {
  const v1::CheckpointIndex index = SmallIndex();
  IndexLookup lookup(index);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<Read> reads,
                                 ComputeReads(lookup, Want("norm", StateKind::kMoment1, 2, 5)));
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].file, 0);
  EXPECT_EQ(reads[0].state, 1);
  EXPECT_EQ(reads[0].piece, 0);
  EXPECT_EQ(reads[0].piece_offset, 8);  // elements 2, 3 of piece [0, 4)
  EXPECT_EQ(reads[0].bytes, 8);
  EXPECT_EQ(reads[0].dest_element, 0);
  EXPECT_EQ(reads[1].file, 1);
  EXPECT_EQ(reads[1].piece, 1);
  EXPECT_EQ(reads[1].piece_offset, 0);  // element 4 of piece [4, 6)
  EXPECT_EQ(reads[1].bytes, 4);
  EXPECT_EQ(reads[1].dest_element, 2);
  EXPECT_EQ(FileOffset(index, reads[0]), index.tensors(0).states(1).pieces(0).data_offset() + 8);
  // Checksum chunks are 8 bytes: both reads are chunk-aligned but the second
  // covers half of piece 1's only chunk.
  EXPECT_EQ(VerifiedReadBytes(index, reads[0]), 8);
  EXPECT_EQ(VerifiedReadBytes(index, reads[1]), 8);
}

TEST(ComputeReadsTest, WholeTensorAndEmptyRange) {
  const v1::CheckpointIndex index = SmallIndex();
  IndexLookup lookup(index);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<Read> whole, ComputeReads(lookup, Want("norm", StateKind::kMaster, 0, 6)));
  ASSERT_EQ(whole.size(), 2u);
  EXPECT_EQ(whole[0].bytes + whole[1].bytes, 24);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<Read> none, ComputeReads(lookup, Want("norm", StateKind::kMaster, 3, 3)));
  EXPECT_TRUE(none.empty());
}

TEST(ComputeReadsTest, AnotherModel_IsInvalidArgumentNamingTheTensor) {
  const v1::CheckpointIndex index = SmallIndex();
  IndexLookup lookup(index);
  EXPECT_THAT(ComputeReads(lookup, Want("other", StateKind::kMaster, 0, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor \"other\" master [0, 1): not in")));
  EXPECT_THAT(ComputeReads(lookup, Want("norm", StateKind::kMomentum, 0, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("saved for ADAMW")));
  EXPECT_THAT(ComputeReads(lookup, Want("norm", StateKind::kMaster, 2, 7)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has 6 elements")));
  EXPECT_THAT(ComputeReads(index, {Want("norm", StateKind::kMaster, 4, 2)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a valid range")));
}

}  // namespace
}  // namespace muonshard::checkpoint
