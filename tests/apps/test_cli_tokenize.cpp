// `hybridflow tokenize` as a user runs it: the ids of a published tokenizer (the text layer's, which
// tests/text checks against the Python tokenizers library), JSON output, and its errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridflow/core/fs.h"
#include "hybridflow/text/tokenizer.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "text/testdata_dir.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_hybridflow;

std::string spm_dir() { return hybridflow::testing::tokenizer_data_dir() + "/spm-bpe-32k"; }

TEST(CliTokenize, JsonHasTheTextLayersIdsWithAndWithoutSpecialTokens) {
  if (!hybridflow::file_exists(spm_dir() + "/tokenizer.json")) GTEST_SKIP() << "not found: " << spm_dir();
  const std::string text = "Hello  wörld 👋";
  hybridflow::testing::TempDir dir;
  hybridflow::write_file_atomic(dir.file("in.txt"), text);
  const auto tok = hybridflow::text::Tokenizer::from_file(spm_dir() + "/tokenizer.json");
  for (bool special : {true, false}) {
    CommandResult r = run_hybridflow("tokenize --tokenizer " + spm_dir() + " --file " + dir.file("in.txt") + " --json" +
                                     (special ? "" : " --no-special"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json out = nlohmann::json::parse(r.output);
    EXPECT_EQ(out["text"], text);
    const std::vector<int32_t> expected = tok.encode(text, special);
    EXPECT_EQ(out["ids"].get<std::vector<int32_t>>(), expected);
    EXPECT_EQ(out["tokens"].get<std::vector<std::string>>(), tok.tokens(expected));
  }
}

TEST(CliTokenize, PlainOutputListsEachToken) {
  if (!hybridflow::file_exists(spm_dir() + "/tokenizer.json")) GTEST_SKIP() << "not found: " << spm_dir();
  CommandResult r = run_hybridflow("tokenize --tokenizer " + spm_dir() + " 'Hi there'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto tok = hybridflow::text::Tokenizer::from_file(spm_dir() + "/tokenizer.json");
  const std::vector<int32_t> ids = tok.encode("Hi there", true);
  EXPECT_NE(r.output.find(std::to_string(ids.size()) + " tokens"), std::string::npos) << r.output;
  for (const std::string& t : tok.tokens(ids)) EXPECT_NE(r.output.find("\"" + t + "\""), std::string::npos) << t;
}

TEST(CliTokenize, ErrorsSayWhatIsWrong) {
  hybridflow::testing::TempDir dir;
  CommandResult none = run_hybridflow("tokenize --tokenizer " + dir.path());
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.output.find("exactly one"), std::string::npos) << none.output;
  CommandResult missing = run_hybridflow("tokenize --tokenizer " + dir.path() + " hello");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find(dir.file("tokenizer.json")), std::string::npos) << missing.output;
}

}  // namespace
