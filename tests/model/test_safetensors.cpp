#include "hybridflow/model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "support/temp_dir.h"

namespace hybridflow {
namespace {

using ::testing::HasSubstr;

// A file from a raw header string and raw data bytes, so that tests can build any broken layout.
std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// Expects parse_safetensors to throw an Error whose message names the file and contains `needle`.
void expect_error(const std::string& bytes, const std::string& needle) {
  try {
    parse_safetensors(bytes, "broken.safetensors");
    FAIL() << "expected an error containing: " << needle;
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("broken.safetensors")) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(needle)) << e.what();
  }
}

TEST(Safetensors, RoundTripKeepsValuesDtypesShapesAndMetadata) {
  testing::TempDir dir;
  torch::manual_seed(0);
  NamedTensors tensors = {
      {"a.weight", torch::randn({3, 5})},
      {"b.half", torch::randn({4}).to(torch::kFloat16)},
      {"c.bf16", torch::randn({2, 2, 3}).to(torch::kBFloat16)},
      {"d.ids", torch::arange(7, torch::kInt64)},
      {"e.i32", torch::tensor({-3, 4}, torch::kInt32)},
      {"f.u8", torch::tensor({0, 255, 7}, torch::kUInt8)},
      {"g.mask", torch::tensor({true, false, true})},
      {"h.scalar", torch::tensor(2.5)},
      {"i.empty", torch::zeros({0, 4})},
      {"j.strided", torch::randn({4, 6}).t()},  // non-contiguous input is written in logical order
  };
  const std::string path = dir.file("m.safetensors");
  write_safetensors(path, tensors, {{"format", "pt"}});
  // Read into memory, and mapped (tensors that view the file, outliving the returned struct's copy).
  for (bool mapped : {false, true}) {
    std::map<std::string, torch::Tensor> got;
    {
      SafetensorsFile f = mapped ? map_safetensors(path) : read_safetensors(path);
      EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
      ASSERT_EQ(f.tensors.size(), tensors.size());
      got = std::map<std::string, torch::Tensor>(f.tensors.begin(), f.tensors.end());
    }
    for (const auto& [name, t] : tensors) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_EQ(got[name].scalar_type(), t.scalar_type()) << name;
      EXPECT_EQ(got[name].sizes(), t.sizes()) << name;
      EXPECT_TRUE(torch::equal(got[name], t)) << name << (mapped ? " (mapped)" : "");
    }
  }
}

TEST(Safetensors, MappedFilesAreCheckedLikeReadOnes) {
  testing::TempDir dir;
  write_file_atomic(dir.file("short.safetensors"), std::string(5, '\0'));
  try {
    map_safetensors(dir.file("short.safetensors"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("short.safetensors: not a safetensors file"));
  }
  EXPECT_THROW(map_safetensors(dir.file("missing.safetensors")), Error);
}

TEST(Safetensors, HeaderIsAlignedAndLayoutMatchesSpec) {
  std::string bytes = serialize_safetensors({{"x", torch::tensor({1.0f, 2.0f})}});
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 8);
  std::string header = bytes.substr(8, n);
  EXPECT_THAT(header, HasSubstr("\"dtype\":\"F32\""));
  EXPECT_THAT(header, HasSubstr("\"shape\":[2]"));
  EXPECT_THAT(header, HasSubstr("\"data_offsets\":[0,8]"));
  float values[2];
  std::memcpy(values, bytes.data() + 8 + n, 8);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], 2.0f);
}

TEST(Safetensors, ReadsHandBuiltFileWithPaddingAndUnsortedOffsets) {
  // Two tensors listed out of offset order, header padded with spaces, BF16 1.0 = 0x3F80.
  std::string header =
      R"({"b":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]},"a":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})";
  header += "      ";
  std::string data = {7, 0, 0, 0, '\x80', '\x3f'};
  SafetensorsFile f = parse_safetensors(make_file(header, data), "hand.safetensors");
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "a");
  EXPECT_EQ(f.tensors[0].second.item<int32_t>(), 7);
  EXPECT_EQ(f.tensors[1].first, "b");
  EXPECT_EQ(f.tensors[1].second.to(torch::kFloat32).item<float>(), 1.0f);
  EXPECT_TRUE(f.metadata.empty());
}

TEST(Safetensors, RejectsTruncatedFiles) {
  expect_error("", "shorter than the 8-byte header length");
  expect_error(std::string(5, '\0'), "shorter than the 8-byte header length");
  std::string bytes = make_file("{}", "");
  bytes[0] = 100;  // claims a 100-byte header in a 10-byte file
  expect_error(bytes, "runs past the end of the file");
  std::string huge(8, '\xff');
  expect_error(huge + "{}", "runs past the end of the file");
}

TEST(Safetensors, RejectsAbsurdHeaderLengthBeforeReadingIt) {
  // A sparse 200 MB file claiming a 150 MB header: within the file, but no real header is that large, and
  // parsing it would cost its size in memory. Mapped, so nothing is read.
  testing::TempDir dir;
  const std::string path = dir.file("huge_header.safetensors");
  std::string prefix(8, '\0');
  const uint64_t claimed = 150ull << 20;
  for (int i = 0; i < 8; ++i) prefix[static_cast<size_t>(i)] = static_cast<char>((claimed >> (8 * i)) & 0xff);
  write_file_atomic(path, prefix + "{");
  std::filesystem::resize_file(path, 200ull << 20);
  try {
    map_safetensors(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("huge_header.safetensors: safetensors header length 157286400 exceeds the "
                                    "104857600-byte limit"));
  }
}

TEST(Safetensors, TruncatedRealFileNamesTheTensorCutOff) {
  testing::TempDir dir;
  const std::string path = dir.file("cut.safetensors");
  write_safetensors(path, {{"a", torch::ones({4})}, {"b", torch::ones({8})}});
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 5);
  try {
    map_safetensors(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cut.safetensors: tensor 'b' data_offsets [16, 48] out of range: data buffer "
                                    "has 43 bytes (file truncated?)"));
  }
}

TEST(Safetensors, RejectsBadJson) {
  expect_error(make_file("{\"a\": ", ""), "not valid JSON");
  expect_error(make_file("[1,2]", ""), "must be a JSON object");
}

TEST(Safetensors, RejectsMissingOrMistypedFields) {
  expect_error(make_file(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')),
               "tensor 'w' is missing field 'dtype'");
  expect_error(make_file(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", std::string(4, '\0')),
               "tensor 'w' is missing field 'shape'");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1]}})", std::string(4, '\0')),
               "tensor 'w' is missing field 'data_offsets'");
  expect_error(make_file(R"({"w":3})", ""), "tensor 'w' must be an object");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0')),
               "must be a non-negative integer");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", std::string(4, '\0')),
               "data_offsets must be [begin, end]");
  expect_error(make_file(R"({"__metadata__":{"k":1}})", ""), "__metadata__ value for 'k' must be a string");
}

TEST(Safetensors, RejectsUnknownDtype) {
  expect_error(make_file(R"({"w":{"dtype":"F8_E9","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0')),
               "tensor 'w' has unknown dtype 'F8_E9'");
}

TEST(Safetensors, RejectsShapeByteSizeMismatch) {
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", std::string(20, '\0')),
               "needs 24 bytes but data_offsets [0, 20] span 20");
  // A shape whose byte size overflows 64 bits must not wrap around to a small size.
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", ""),
               "overflows");
}

TEST(Safetensors, RejectsOffsetsOutOfRange) {
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(4, '\0')),
               "out of range: data buffer has 4 bytes");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", ""), "begin > end");
}

TEST(Safetensors, RejectsOverlapsGapsAndTrailingBytes) {
  const std::string two_overlapping =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  expect_error(make_file(two_overlapping, std::string(8, '\0')), "tensor 'b' data_offsets [4, 8] overlap");
  const std::string gap =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  expect_error(make_file(gap, std::string(12, '\0')), "gap of 4 bytes");
  const std::string late_start = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  expect_error(make_file(late_start, std::string(8, '\0')), "must be contiguous");
  const std::string one = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_error(make_file(one, std::string(6, '\0')), "trailing bytes");
}

TEST(Safetensors, RejectsDuplicateNames) {
  const std::string dup =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  expect_error(make_file(dup, std::string(2, '\0')), "names tensor 'a' twice");
  try {
    serialize_safetensors({{"x", torch::zeros({1})}, {"x", torch::zeros({1})}});
    FAIL() << "duplicate names written";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'x' given twice"));
  }
}

TEST(Safetensors, ReadErrorNamesMissingFile) {
  testing::TempDir dir;
  EXPECT_THROW(
      {
        try {
          read_safetensors(dir.file("nope.safetensors"));
        } catch (const Error& e) {
          EXPECT_THAT(e.what(), HasSubstr("nope.safetensors"));
          throw;
        }
      },
      Error);
}

TEST(Safetensors, WriteIsAtomicAndLeavesNoTempFile) {
  testing::TempDir dir;
  write_safetensors(dir.file("w.safetensors"), {{"x", torch::ones({3})}});
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1);
  EXPECT_TRUE(torch::equal(read_safetensors(dir.file("w.safetensors")).tensors[0].second, torch::ones({3})));
}

}  // namespace
}  // namespace hybridflow
