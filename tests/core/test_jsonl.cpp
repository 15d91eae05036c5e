#include "hybridflow/core/jsonl.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "support/temp_dir.h"
#include "support/error_of.h"

namespace hybridflow {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

using hybridflow::testing::error_of;

TEST(Jsonl, ParsesLinesSkippingBlanksAndCarriageReturns) {
  auto rows = parse_jsonl("{\"q\": \"1+1\", \"a\": 2}\r\n\n  \n[1, 2]\n\"tail\"", "mem");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["q"], "1+1");
  EXPECT_EQ(rows[0]["a"], 2);
  EXPECT_EQ(rows[1], json({1, 2}));
  EXPECT_EQ(rows[2], "tail");
  EXPECT_TRUE(parse_jsonl("", "mem").empty());
}

TEST(Jsonl, BadLineNamesFileAndLine) {
  std::string msg = error_of([] { parse_jsonl("{\"a\": 1}\n\n{\"a\": }\n", "data/train.jsonl"); });
  EXPECT_THAT(msg, HasSubstr("data/train.jsonl:3: invalid JSON"));
  EXPECT_THAT(msg, ::testing::Not(HasSubstr("cut off")));
  EXPECT_THAT(error_of([] { parse_jsonl("{\"a\": 1}\n{\"a\": 1", "log.jsonl"); }),
              HasSubstr("log.jsonl:2: invalid JSON"));
  EXPECT_THAT(error_of([] { parse_jsonl("{\"a\": 1}\n{\"a\": 1", "log.jsonl"); }), HasSubstr("cut off"));
}

TEST(Jsonl, WriteReadAndAppendRoundTrip) {
  testing::TempDir dir;
  std::string path = dir.file("metrics.jsonl");
  EXPECT_THROW(read_jsonl(path), Error);
  std::vector<json> rows = {{{"step", 1}, {"loss", 0.5}}, {{"text", u8"caf\u00e9\nline"}}};
  write_jsonl(path, rows);
  EXPECT_EQ(read_jsonl(path), rows);
  append_jsonl(path, json{{"step", 2}});
  append_jsonl(path, std::vector<json>{json{{"step", 3}}, json::array()});
  auto back = read_jsonl(path);
  ASSERT_EQ(back.size(), 5u);  // 2 written + 1 + 2 appended
  EXPECT_EQ(back[2]["step"], 2);
  EXPECT_EQ(back[3]["step"], 3);
  append_jsonl(path, std::vector<json>{});  // nothing to add: file unchanged
  EXPECT_EQ(read_jsonl(path), back);
  EXPECT_EQ(back.back(), json::array());
  write_jsonl(path, {json{{"fresh", true}}});  // replaces, does not append
  EXPECT_EQ(read_jsonl(path).size(), 1u);
  std::string bad = "\xff";
  EXPECT_THAT(error_of([&] { write_jsonl(path, {json{{"s", bad}}}); }), HasSubstr("cannot write row 0"));
}

TEST(Jsonl, AppendAfterCutOffLineKeepsNewRowsReadable) {
  testing::TempDir dir;
  std::string path = dir.file("log.jsonl");
  write_file_atomic(path, "{\"step\": 1}\n{\"step\": 2, \"lo");
  append_jsonl(path, json{{"step", 3}});
  EXPECT_EQ(read_file(path), "{\"step\": 1}\n{\"step\": 2, \"lo\n{\"step\":3}\n");
  EXPECT_THAT(error_of([&] { read_jsonl(path); }), HasSubstr(path + ":2: invalid JSON"));
}

}  // namespace
}  // namespace hybridflow
