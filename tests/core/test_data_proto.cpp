#include "hybridflow/core/data_proto.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/core/error.h"
#include "support/error_of.h"

namespace hybridflow {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

// Rows are distinguishable: row r of "x" is [10r, 10r+1], "id" is r, field "prompt" is "p<r>".
DataProto make_batch(int64_t n) {
  DataProto d;
  d.set_tensor("x", torch::arange(2 * n, torch::kFloat).reshape({n, 2}) * 5);
  d.set_tensor("id", torch::arange(n, torch::kLong));
  std::vector<json> prompts;
  for (int64_t i = 0; i < n; ++i) prompts.push_back("p" + std::to_string(i));
  d.set_field("prompt", prompts);
  d.meta()["temperature"] = 0.7;
  return d;
}

std::vector<int64_t> ids(const DataProto& d) {
  torch::Tensor t = d.tensor("id").contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

// Checks that every row of `d` is consistent: x, id and prompt all describe the same source row.
void expect_rows_aligned(const DataProto& d) {
  auto id = ids(d);
  ASSERT_EQ(static_cast<int64_t>(id.size()), d.batch_size());
  for (size_t i = 0; i < id.size(); ++i) {
    EXPECT_EQ(d.field("prompt")[i], "p" + std::to_string(id[i]));
    EXPECT_FLOAT_EQ(d.tensor("x")[static_cast<int64_t>(i)][1].item<float>(), (2 * id[i] + 1) * 5.0f);
  }
}

using hybridflow::testing::error_of;

TEST(DataProto, EmptyHasBatchZeroAndFirstEntrySetsSize) {
  DataProto d;
  EXPECT_EQ(d.batch_size(), 0);
  EXPECT_TRUE(d.empty());
  d.set_field("prompt", {"a", "b", "c"});
  EXPECT_EQ(d.batch_size(), 3);
  std::string msg = error_of([&] { d.set_tensor("x", torch::zeros({4, 2})); });
  EXPECT_THAT(msg, HasSubstr("'x' has 4 rows but the batch has 3"));
  EXPECT_THAT(error_of([&] { d.set_field("y", {1, 2}); }), HasSubstr("'y' has 2 rows"));
  EXPECT_THAT(error_of([&] { d.set_tensor("s", torch::tensor(1.0)); }), HasSubstr("scalar"));
  EXPECT_THAT(error_of([&] { d.set_tensor("c", torch::zeros({3}, torch::kComplexFloat)); }),
              HasSubstr("unsupported tensor dtype"));
  // Replacing the only entry may change the size.
  DataProto one;
  one.set_tensor("x", torch::zeros({2}));
  one.set_tensor("x", torch::zeros({5}));
  EXPECT_EQ(one.batch_size(), 5);
}

TEST(DataProto, UnknownKeyNamesAvailableKeys) {
  DataProto d = make_batch(2);
  std::string msg = error_of([&] { d.tensor("logits"); });
  EXPECT_THAT(msg, HasSubstr("'logits'"));
  EXPECT_THAT(msg, HasSubstr("id, x"));
  EXPECT_THAT(error_of([&] { d.field("answer"); }), HasSubstr("available fields: prompt"));
  EXPECT_TRUE(d.has_tensor("x"));
  EXPECT_FALSE(d.has_tensor("prompt"));
  EXPECT_TRUE(d.has_field("prompt"));
}

TEST(DataProto, ChunkSplitsEvenlyAndRejectsIndivisible) {
  DataProto d = make_batch(6);
  auto parts = d.chunk(3);
  ASSERT_EQ(parts.size(), 3u);
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].batch_size(), 2);
    EXPECT_EQ(ids(parts[i]), (std::vector<int64_t>{2 * int64_t(i), 2 * int64_t(i) + 1}));
    expect_rows_aligned(parts[i]);
    EXPECT_EQ(parts[i].meta()["temperature"], 0.7);
  }
  std::string msg = error_of([&] { d.chunk(4); });
  EXPECT_THAT(msg, HasSubstr("batch size 6 is not divisible by 4"));
  EXPECT_THAT(msg, HasSubstr("padded_to_multiple(4"));
  EXPECT_THAT(error_of([&] { d.chunk(0); }), HasSubstr("positive"));
}

TEST(DataProto, PadChunkConcatRoundTrip) {
  DataProto d = make_batch(5);
  int64_t pad = -1;
  DataProto padded = d.padded_to_multiple(4, &pad);
  EXPECT_EQ(pad, 3);
  EXPECT_EQ(padded.batch_size(), 8);
  EXPECT_EQ(ids(padded), (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2}));
  expect_rows_aligned(padded);
  DataProto back = DataProto::concat(padded.chunk(4));
  EXPECT_TRUE(torch::equal(back.tensor("x"), padded.tensor("x")));
  DataProto trimmed = back.slice(0, back.batch_size() - pad);
  EXPECT_TRUE(torch::equal(trimmed.tensor("x"), d.tensor("x")));
  EXPECT_EQ(trimmed.field("prompt"), d.field("prompt"));
  EXPECT_EQ(trimmed.meta(), d.meta());

  // Padding beyond the batch size cycles through the rows again.
  DataProto tiny = make_batch(2).padded_to_multiple(7, &pad);
  EXPECT_EQ(pad, 5);
  EXPECT_EQ(ids(tiny), (std::vector<int64_t>{0, 1, 0, 1, 0, 1, 0}));
  make_batch(4).padded_to_multiple(2, &pad);
  EXPECT_EQ(pad, 0);
}

TEST(DataProto, SliceAndIndexSelect) {
  DataProto d = make_batch(5);
  DataProto s = d.slice(1, 4);
  EXPECT_EQ(ids(s), (std::vector<int64_t>{1, 2, 3}));
  expect_rows_aligned(s);
  EXPECT_EQ(d.slice(2, 2).batch_size(), 0);
  EXPECT_THAT(error_of([&] { d.slice(3, 6); }), HasSubstr("outside the batch of 5"));
  EXPECT_THAT(error_of([&] { d.slice(3, 2); }), HasSubstr("[3, 2)"));

  DataProto picked = d.index_select(torch::tensor({4, 0, 4}, torch::kInt));
  EXPECT_EQ(ids(picked), (std::vector<int64_t>{4, 0, 4}));
  expect_rows_aligned(picked);
  EXPECT_THAT(error_of([&] { d.index_select(torch::tensor({0, 5}, torch::kLong)); }),
              HasSubstr("row index 5 is outside"));
  EXPECT_THAT(error_of([&] { d.index_select(torch::tensor({-1}, torch::kLong)); }), HasSubstr("row index -1"));
  EXPECT_THAT(error_of([&] { d.index_select(torch::tensor({0.0})); }), HasSubstr("int64 or int32"));
}

TEST(DataProto, SelectKeepsOnlyNamedKeys) {
  DataProto d = make_batch(3);
  DataProto s = d.select({"x"}, {"prompt"});
  EXPECT_TRUE(s.has_tensor("x"));
  EXPECT_FALSE(s.has_tensor("id"));
  EXPECT_TRUE(s.has_field("prompt"));
  EXPECT_EQ(s.meta(), d.meta());
  EXPECT_FALSE(d.select({"id"}).has_field("prompt"));
  EXPECT_THAT(error_of([&] { d.select({"nope"}); }), HasSubstr("no tensor 'nope'"));
}

TEST(DataProto, RepeatInterleavedVersusTiled) {
  DataProto d = make_batch(3);
  DataProto inter = d.repeat(2, /*interleave=*/true);
  EXPECT_EQ(ids(inter), (std::vector<int64_t>{0, 0, 1, 1, 2, 2}));
  expect_rows_aligned(inter);
  DataProto tiled = d.repeat(2, /*interleave=*/false);
  EXPECT_EQ(ids(tiled), (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  expect_rows_aligned(tiled);
  EXPECT_THAT(error_of([&] { d.repeat(0); }), HasSubstr("positive"));
}

TEST(DataProto, ConcatChecksKeysAndShapes) {
  DataProto a = make_batch(2);
  DataProto b = make_batch(3);
  b.meta()["temperature"] = 1.0;
  DataProto c = DataProto::concat({a, DataProto(), b});
  EXPECT_EQ(ids(c), (std::vector<int64_t>{0, 1, 0, 1, 2}));
  EXPECT_EQ(c.meta()["temperature"], 0.7);  // meta comes from the first part
  EXPECT_EQ(DataProto::concat({}).batch_size(), 0);

  DataProto missing = b.select({"x", "id"});
  EXPECT_THAT(error_of([&] { DataProto::concat({a, missing}); }),
              HasSubstr("part 1 has tensors [id, x] fields [(none)]"));
  DataProto wide = make_batch(2);
  wide.set_tensor("x", torch::zeros({2, 3}));
  EXPECT_THAT(error_of([&] { DataProto::concat({a, wide}); }), HasSubstr("only dim 0 may differ"));
}

TEST(DataProto, UpdateUnionsAndRejectsConflicts) {
  DataProto a = make_batch(3);
  DataProto b;
  b.set_tensor("reward", torch::tensor({1.0f, 0.0f, 1.0f}));
  b.set_tensor("id", torch::arange(3, torch::kLong));  // same content as a's: allowed
  b.meta()["step"] = 4;
  DataProto u = DataProto::union_of(a, b);
  EXPECT_TRUE(u.has_tensor("reward"));
  EXPECT_TRUE(u.has_field("prompt"));
  EXPECT_EQ(u.meta()["step"], 4);
  EXPECT_EQ(u.meta()["temperature"], 0.7);

  DataProto conflict;
  conflict.set_tensor("id", torch::tensor({0, 1, 7}, torch::kLong));
  std::string msg = error_of([&] { a.update(conflict); });
  EXPECT_THAT(msg, HasSubstr("tensor 'id' is in both with different content"));
  EXPECT_FALSE(a.has_tensor("reward"));  // a failed update changes nothing

  DataProto field_conflict;
  field_conflict.set_field("prompt", {"p0", "p1", "other"});
  EXPECT_THAT(error_of([&] { a.update(field_conflict); }), HasSubstr("field 'prompt'"));
  DataProto meta_conflict;
  meta_conflict.meta()["temperature"] = 1.0;
  EXPECT_THAT(error_of([&] { a.update(meta_conflict); }), HasSubstr("meta key 'temperature' differs"));
  EXPECT_THAT(error_of([&] { a.update(make_batch(4)); }), HasSubstr("batch sizes differ: 3 vs 4"));
}

TEST(DataProto, SummaryAndToDevice) {
  DataProto d = make_batch(2);
  EXPECT_EQ(d.summary(),
            "DataProto(batch 2; tensors: id int64[2], x float32[2, 2]; fields: prompt; meta: temperature)");
  EXPECT_EQ(DataProto().summary(), "DataProto(batch 0; tensors: (none); fields: (none); meta: (none))");
  DataProto moved = d.to(torch::kCPU);
  EXPECT_EQ(moved.tensor("x").data_ptr(), d.tensor("x").data_ptr());  // already there: shared
  EXPECT_EQ(moved.field("prompt"), d.field("prompt"));
}

// Values that survive a float16/bfloat16 round trip exactly, so any byte mix-up shows.
DataProto all_dtypes() {
  DataProto d;
  torch::Tensor base = torch::arange(12, torch::kDouble).reshape({4, 3}) - 5;
  for (auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16, torch::kDouble, torch::kLong, torch::kInt,
                     torch::kChar, torch::kByte}) {
    torch::Tensor t = dtype == torch::kByte ? (base + 5).to(dtype) : base.to(dtype);
    d.set_tensor(dtype_name(dtype), t);
  }
  d.set_tensor("bool", base.gt(0));
  d.set_tensor("transposed", torch::arange(12, torch::kFloat).reshape({3, 4}).t());  // non-contiguous
  d.set_tensor("strided", torch::arange(16, torch::kLong).reshape({8, 2}).slice(0, 0, 8, 2));
  d.set_tensor("empty_cols", torch::zeros({4, 0}));
  d.set_field("prompt", {"a", json::object({{"k", 1}}), nullptr, u8"\u00e9t\u00e9"});
  d.meta()["global_step"] = 3;
  d.meta()["nested"] = {{"a", {1, 2, 3}}};
  return d;
}

void expect_equal(const DataProto& a, const DataProto& b) {
  ASSERT_EQ(a.batch_size(), b.batch_size());
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const auto& [key, t] : a.tensors()) {
    ASSERT_TRUE(b.has_tensor(key)) << key;
    const torch::Tensor& u = b.tensor(key);
    EXPECT_EQ(u.scalar_type(), t.scalar_type()) << key;
    EXPECT_EQ(u.sizes(), t.sizes()) << key;
    EXPECT_TRUE(torch::equal(u, t)) << key;
  }
  EXPECT_EQ(a.fields(), b.fields());
  EXPECT_EQ(a.meta(), b.meta());
}

TEST(DataProto, SerializeRoundTripsAllDtypesAndNonContiguous) {
  DataProto d = all_dtypes();
  std::string bytes = d.serialize();
  expect_equal(d, DataProto::deserialize(bytes));
  expect_equal(d, DataProto::deserialize(std::string(bytes)));
  expect_equal(DataProto(), DataProto::deserialize(DataProto().serialize()));
  expect_equal(d.slice(1, 1), DataProto::deserialize(d.slice(1, 1).serialize()));
  EXPECT_THAT(error_of([] { dtype_from_name("complex64"); }), HasSubstr("supported: float32"));
}

TEST(DataProto, FromFramesViewsPayloadsWithoutCopying) {
  DataProto d = all_dtypes();
  DataProto::Frames frames = d.to_frames();
  ASSERT_EQ(frames.payloads.size(), d.tensors().size());
  std::vector<Buffer> buffers;
  for (const auto& p : frames.payloads) {
    EXPECT_TRUE(p.is_contiguous());
    buffers.push_back(Buffer{p.data_ptr(), p.nbytes(), std::make_shared<torch::Tensor>(p)});
  }
  DataProto back = DataProto::from_frames(frames.header, buffers);
  expect_equal(d, back);
  // Zero copy: the received tensor aliases the payload memory, and keeps it alive after frames go away.
  size_t f32 = static_cast<size_t>(std::distance(d.tensors().begin(), d.tensors().find("float32")));
  EXPECT_EQ(back.tensor("float32").data_ptr(), frames.payloads[f32].data_ptr());
  frames = {};
  buffers.clear();
  EXPECT_TRUE(torch::equal(back.tensor("float32"), d.tensor("float32")));

  std::vector<Buffer> short_list(buffers.begin(), buffers.end());
  EXPECT_THAT(error_of([&] { DataProto::from_frames(d.to_frames().header, short_list); }),
              HasSubstr("payloads were given"));
  DataProto::Frames f2 = d.to_frames();
  std::vector<Buffer> wrong;
  for (const auto& p : f2.payloads) wrong.push_back(Buffer{p.data_ptr(), p.nbytes() / 2, nullptr});
  EXPECT_THAT(error_of([&] { DataProto::from_frames(f2.header, wrong); }), HasSubstr("bytes but its payload has"));
}

TEST(DataProto, DeserializeRejectsTruncatedAndCorruptInput) {
  std::string bytes = all_dtypes().serialize();
  // Every truncation must fail cleanly with an Error (and never read past the end: run under ASan to see).
  for (size_t len = 0; len < bytes.size(); len += std::max<size_t>(1, len / 7)) {
    std::string cut = bytes.substr(0, len);
    EXPECT_THROW(DataProto::deserialize(cut), Error) << "length " << len;
  }
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  EXPECT_THAT(error_of([&] { DataProto::deserialize(bad_magic); }), HasSubstr("bad magic"));
  std::string bad_version = bytes;
  bad_version[4] = 9;
  EXPECT_THAT(error_of([&] { DataProto::deserialize(bad_version); }), HasSubstr("unsupported format version 9"));
  std::string huge_header = bytes;
  huge_header[15] = '\x7f';
  EXPECT_THAT(error_of([&] { DataProto::deserialize(huge_header); }), HasSubstr("truncated"));
  // Flip every byte of the header in turn: each corrupt header must be rejected or decode to a valid batch.
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data() + 8, 8);
  for (size_t i = 16; i < 16 + header_len; ++i) {
    std::string corrupt = bytes;
    corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
    try {
      DataProto d = DataProto::deserialize(corrupt);
      for (const auto& kv : d.tensors()) EXPECT_EQ(kv.second.size(0), d.batch_size());
    } catch (const Error&) {
    }
  }
  // A header whose shape disagrees with its byte count.
  DataProto one;
  one.set_tensor("x", torch::zeros({2, 2}));
  std::string s = one.serialize();
  auto pos = s.find("[2,2]");
  ASSERT_NE(pos, std::string::npos);
  s[pos + 3] = '3';
  EXPECT_THAT(error_of([&] { DataProto::deserialize(s); }), HasSubstr("needs 24 bytes but its payload has 16"));
}

}  // namespace
}  // namespace hybridflow
