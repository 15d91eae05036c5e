// RL data in verl's format: parquet written here with Arrow C++ and by Python's pyarrow (what verl's
// preprocessing scripts use), JSONL rows of the same shape, the older {"prompt", "answer"} rows, and the
// errors a bad row gives (file, row, column and what was expected).
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>

#include <fstream>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/tasks/parquet_rows.h"
#include "hybridflow/tasks/prompt_rows.h"
#include "support/error_of.h"
#include "support/python.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace hybridflow {
namespace {

using Json = nlohmann::ordered_json;
using testing::error_of;
using testing::TempDir;

void ok(const arrow::Status& s) { ASSERT_TRUE(s.ok()) << s.ToString(); }

template <typename B>
B& as(arrow::ArrayBuilder* b) {
  return *static_cast<B*>(b);
}

void write_table(const std::shared_ptr<arrow::Table>& table, const std::string& path, int64_t rows_per_group) {
  auto out = arrow::io::FileOutputStream::Open(path).ValueOrDie();
  ok(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out, rows_per_group));
  ok(out->Close());
}

std::shared_ptr<arrow::Array> finish(arrow::ArrayBuilder& b) { return b.Finish().ValueOrDie(); }

// Three verl rows built column by column with Arrow's builders, in types pandas would not all choose
// (int32, float, a nested struct, a list of strings, an all-null field), written two rows per row group so
// that the reader crosses chunks.
std::string write_verl_parquet_with_arrow(const TempDir& dir) {
  const auto message = arrow::struct_({arrow::field("content", arrow::utf8()), arrow::field("role", arrow::utf8())});
  auto prompt = arrow::MakeBuilder(arrow::list(message)).ValueOrDie();
  auto& prompt_list = as<arrow::ListBuilder>(prompt.get());
  auto& msg = as<arrow::StructBuilder>(prompt_list.value_builder());
  auto add_message = [&](const std::string& role, const std::string& content) {
    ok(msg.Append());
    ok(as<arrow::StringBuilder>(msg.field_builder(0)).Append(content));
    ok(as<arrow::StringBuilder>(msg.field_builder(1)).Append(role));
  };
  ok(prompt_list.Append());
  add_message("system", "You are a careful calculator.");
  add_message("user", "What is 2+3?");
  ok(prompt_list.Append());
  add_message("user", "Say \"hi\" in French.");
  ok(prompt_list.Append());
  add_message("user", "7*6?");

  arrow::StringBuilder source;
  ok(source.AppendValues({"math/simple", "chat/fr", "math/simple"}));
  arrow::StringBuilder ability;
  ok(ability.AppendValues({"math", "chat", "math"}));

  const auto reward_type = arrow::struct_({arrow::field("style", arrow::utf8()), arrow::field("ground_truth", arrow::utf8())});
  auto reward = arrow::MakeBuilder(reward_type).ValueOrDie();
  auto& rm = as<arrow::StructBuilder>(reward.get());
  for (const auto& [style, truth] : std::vector<std::pair<std::string, std::string>>{{"rule", "5"}, {"model", ""}, {"rule", "42"}}) {
    ok(rm.Append());
    ok(as<arrow::StringBuilder>(rm.field_builder(0)).Append(style));
    if (truth.empty()) ok(rm.field_builder(1)->AppendNull());
    else ok(as<arrow::StringBuilder>(rm.field_builder(1)).Append(truth));
  }

  const auto extra_type = arrow::struct_({arrow::field("index", arrow::int32()), arrow::field("weight", arrow::float32()),
                                          arrow::field("hard", arrow::boolean()), arrow::field("tags", arrow::list(arrow::utf8())),
                                          arrow::field("origin", arrow::struct_({arrow::field("line", arrow::int64())})),
                                          arrow::field("note", arrow::null())});
  auto extra = arrow::MakeBuilder(extra_type).ValueOrDie();
  auto& ex = as<arrow::StructBuilder>(extra.get());
  for (int i : {0, 2}) {  // row 1 has no extra_info at all
    if (i == 2) ok(ex.AppendNull());
    ok(ex.Append());
    ok(as<arrow::Int32Builder>(ex.field_builder(0)).Append(i));
    ok(as<arrow::FloatBuilder>(ex.field_builder(1)).Append(0.5f * static_cast<float>(i + 1)));
    ok(as<arrow::BooleanBuilder>(ex.field_builder(2)).Append(i == 2));
    auto& tags = as<arrow::ListBuilder>(ex.field_builder(3));
    ok(tags.Append());
    ok(as<arrow::StringBuilder>(tags.value_builder()).AppendValues({"t" + std::to_string(i), "all"}));
    auto& origin = as<arrow::StructBuilder>(ex.field_builder(4));
    ok(origin.Append());
    ok(as<arrow::Int64Builder>(origin.field_builder(0)).Append(100 + i));
    ok(ex.field_builder(5)->AppendNull());
  }

  auto schema = arrow::schema({arrow::field("data_source", arrow::utf8()), arrow::field("prompt", arrow::list(message)),
                               arrow::field("ability", arrow::utf8()), arrow::field("reward_model", reward_type),
                               arrow::field("extra_info", extra_type)});
  auto table = arrow::Table::Make(schema, {finish(source), finish(*prompt), finish(ability), finish(*reward), finish(*extra)});
  const std::string path = dir.file("train.parquet");
  write_table(table, path, 2);
  return path;
}

TEST(PromptRows, ReadsVerlParquetWrittenWithArrow) {
  TempDir dir;
  const std::string path = write_verl_parquet_with_arrow(dir);
  const auto rows = read_prompt_rows(path);
  ASSERT_EQ(rows.size(), 3u);

  EXPECT_TRUE(rows[0].is_chat());
  EXPECT_EQ(rows[0].prompt, "");
  ASSERT_EQ(rows[0].messages.size(), 2u);
  EXPECT_EQ(rows[0].messages[0]["role"], "system");
  EXPECT_EQ(rows[0].messages[0]["content"], "You are a careful calculator.");
  EXPECT_EQ(rows[0].messages[1]["role"], "user");
  EXPECT_EQ(rows[0].messages[1]["content"], "What is 2+3?");
  EXPECT_EQ(rows[0].data_source, "math/simple");
  EXPECT_EQ(rows[0].answer, "5");
  EXPECT_EQ(rows[0].extra_info.dump(),
            R"({"index":0,"weight":0.5,"hard":false,"tags":["t0","all"],"origin":{"line":100},"note":null})");
  EXPECT_EQ(rows[0].where, path + ": row 0");

  EXPECT_EQ(rows[1].messages, Json::parse(R"([{"content": "Say \"hi\" in French.", "role": "user"}])"));
  EXPECT_EQ(rows[1].data_source, "chat/fr");
  EXPECT_EQ(rows[1].answer, "");  // reward_model without a ground truth (a model-scored row)
  EXPECT_EQ(rows[1].extra_info, Json::object());

  // Row 2 lies in the second row group: rows are numbered across chunks.
  EXPECT_EQ(rows[2].where, path + ": row 2");
  EXPECT_EQ(rows[2].answer, "42");
  EXPECT_EQ(rows[2].extra_info["weight"], 1.5);
  EXPECT_EQ(rows[2].extra_info["hard"], true);
  EXPECT_EQ(rows[2].extra_info["origin"]["line"], 102);
}

// The file verl's examples/data_preprocess scripts make (pandas / datasets -> pyarrow), written by Python.
TEST(PromptRows, ReadsParquetWrittenByPythonPyarrow) {
  TempDir dir;
  const std::string script = dir.file("write.py"), path = dir.file("gsm8k.parquet");
  write_file_atomic(script, R"(import sys
import pyarrow as pa, pyarrow.parquet as pq
rows = [{"data_source": "openai/gsm8k",
         "prompt": [{"role": "user", "content": "Natalia sold 48 clips. Let's think step by step and output the final answer after \"####\"."}],
         "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "72"},
         "extra_info": {"split": "train", "index": 0, "answer": "48/2 = 24\n#### 72"}},
        {"data_source": "openai/gsm8k",
         "prompt": [{"role": "user", "content": "Weng earns $12 an hour."}],
         "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "10"},
         "extra_info": {"split": "train", "index": 1, "answer": None}}]
pq.write_table(pa.Table.from_pylist(rows), sys.argv[1])
)");
  const auto run = testing::run_shell(testing::python_for_tests() + " " + script + " " + path);
  ASSERT_EQ(run.exit_code, 0) << "needs the project venv's pyarrow (scripts/setup.sh): " << run.output;
  const auto rows = read_prompt_rows(path);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].messages[0]["content"],
            "Natalia sold 48 clips. Let's think step by step and output the final answer after \"####\".");
  EXPECT_EQ(rows[0].messages[0]["role"], "user");
  EXPECT_EQ(rows[0].answer, "72");
  EXPECT_EQ(rows[0].data_source, "openai/gsm8k");
  EXPECT_EQ(rows[0].extra_info, Json::parse(R"({"split": "train", "index": 0, "answer": "48/2 = 24\n#### 72"})"));
  EXPECT_EQ(rows[1].extra_info, Json::parse(R"({"split": "train", "index": 1, "answer": null})"));
}

// What write_parquet_rows makes (hybridflow data --format parquet) reads back the same here and in pyarrow.
TEST(PromptRows, WrittenParquetReadsBackHereAndInPyarrow) {
  TempDir dir;
  const std::string path = dir.file("rows.parquet");
  const std::vector<Json> rows = {
      Json::parse(R"({"data_source": "addition", "prompt": [{"role": "user", "content": "What is 1+2?"}],
                      "reward_model": {"style": "rule", "ground_truth": "3"}, "extra_info": {"split": "train", "index": 0}})"),
      Json::parse(R"({"data_source": "addition", "prompt": [{"role": "user", "content": "What is 10+20?"}],
                      "reward_model": {"style": "rule", "ground_truth": "30"}, "extra_info": {"split": "train", "index": 1, "w": 0.5}})")};
  write_parquet_rows(path, rows);
  const auto back = read_parquet_rows(path);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0]["prompt"], rows[0]["prompt"]);
  EXPECT_EQ(back[0]["extra_info"], Json::parse(R"({"split": "train", "index": 0, "w": null})"));  // one struct type
  EXPECT_EQ(back[1], rows[1]);

  const std::string script = dir.file("read.py");
  write_file_atomic(script, "import sys, json\nimport pyarrow.parquet as pq\n"
                            "print(json.dumps(pq.read_table(sys.argv[1]).to_pylist()))\n");
  const auto run = testing::run_shell(testing::python_for_tests() + " " + script + " " + path);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Json seen = Json::parse(run.output);
  EXPECT_EQ(seen[1], rows[1]);
  EXPECT_EQ(seen[0]["reward_model"]["ground_truth"], "3");

  EXPECT_NE(error_of([&] {
              write_parquet_rows(dir.file("bad.parquet"), {Json::parse(R"({"x": 1})"), Json::parse(R"({"x": "one"})")});
            }).find("row 1: 'x' is string but earlier rows have integer"),
            std::string::npos);
}

TEST(PromptRows, ReadsVerlJsonlAndTheOlderRows) {
  TempDir dir;
  const std::string path = dir.file("mixed.jsonl");
  std::ofstream(path) << R"({"data_source": "gsm8k", "prompt": [{"role": "user", "content": "2+2?"}], "reward_model": {"style": "rule", "ground_truth": 4}, "extra_info": {"index": 9}})"
                      << "\n\n"
                      << R"({"prompt": "1+1=", "answer": "2"})" << "\n"
                      << R"({"prompt": "3+3=", "response": "6", "data_source": "sft"})" << "\n"
                      << R"({"prompt": "plain verl", "reward_model": {"style": "rule", "ground_truth": "x"}})" << "\n";
  const auto rows = read_prompt_rows(path);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_TRUE(rows[0].is_chat());
  EXPECT_EQ(rows[0].answer, "4");  // a numeric ground truth reads as its text
  EXPECT_EQ(rows[0].extra_info, Json::parse(R"({"index": 9})"));
  EXPECT_EQ(rows[0].where, path + ":1");
  EXPECT_FALSE(rows[1].is_chat());
  EXPECT_EQ(rows[1].prompt, "1+1=");
  EXPECT_EQ(rows[1].answer, "2");
  EXPECT_EQ(rows[1].where, path + ":3");
  EXPECT_EQ(rows[2].answer, "6");
  EXPECT_EQ(rows[2].data_source, "sft");
  EXPECT_EQ(rows[3].prompt, "plain verl");
  EXPECT_EQ(rows[3].answer, "x");
}

TEST(PromptRows, BadRowsNameFileRowAndColumn) {
  TempDir dir;
  // prompt messages without content, in row 1 of a parquet file.
  const auto message = arrow::struct_({arrow::field("role", arrow::utf8())});
  auto prompt = arrow::MakeBuilder(arrow::list(message)).ValueOrDie();
  auto& list = as<arrow::ListBuilder>(prompt.get());
  auto& msg = as<arrow::StructBuilder>(list.value_builder());
  for (int i = 0; i < 2; ++i) {
    ok(list.Append());
    ok(msg.Append());
    ok(as<arrow::StringBuilder>(msg.field_builder(0)).Append("user"));
  }
  const std::string no_content = dir.file("no_content.parquet");
  write_table(arrow::Table::Make(arrow::schema({arrow::field("prompt", arrow::list(message))}), {finish(*prompt)}),
              no_content, 1024);
  std::string msg_text = error_of([&] { read_prompt_rows(no_content); });
  EXPECT_NE(msg_text.find(no_content + ": row 0: column 'prompt' must be a string or a non-empty list of {role, content} "
                                       "messages; message 0 has no 'content'"),
            std::string::npos)
      << msg_text;

  // prompt as numbers; no prompt column at all.
  arrow::Int64Builder numbers;
  ok(numbers.AppendValues({1, 2}));
  const std::string numeric = dir.file("numeric.parquet");
  write_table(arrow::Table::Make(arrow::schema({arrow::field("prompt", arrow::int64())}), {finish(numbers)}), numeric, 1024);
  msg_text = error_of([&] { read_prompt_rows(numeric); });
  EXPECT_NE(msg_text.find(numeric + ": row 0: column 'prompt' must be a string or a list of {role, content} messages, got number"),
            std::string::npos)
      << msg_text;
  arrow::StringBuilder questions;
  ok(questions.AppendValues({"a", "b"}));
  const std::string renamed = dir.file("renamed.parquet");
  write_table(arrow::Table::Make(arrow::schema({arrow::field("question", arrow::utf8())}), {finish(questions)}), renamed, 1024);
  msg_text = error_of([&] { read_prompt_rows(renamed); });
  EXPECT_NE(msg_text.find(renamed + ": row 0: missing column 'prompt'"), std::string::npos) << msg_text;

  // JSONL: the line, the key and what was expected.
  const std::string jsonl = dir.file("bad.jsonl");
  std::ofstream(jsonl) << R"({"prompt": "ok", "answer": "1"})" << "\n"
                       << R"({"prompt": [{"role": "user", "content": 5}]})" << "\n";
  msg_text = error_of([&] { read_prompt_rows(jsonl); });
  EXPECT_NE(msg_text.find(jsonl + ":2: key 'prompt' must be"), std::string::npos) << msg_text;
  EXPECT_NE(msg_text.find("'content' of type number"), std::string::npos) << msg_text;
  std::ofstream(jsonl) << R"({"prompt": "x", "reward_model": "5"})" << "\n";
  msg_text = error_of([&] { read_prompt_rows(jsonl); });
  EXPECT_NE(msg_text.find(jsonl + ":1: key 'reward_model' must be {style, ground_truth}, got string"), std::string::npos)
      << msg_text;
  std::ofstream(jsonl) << R"({"prompt": [], "answer": "1"})" << "\n";
  EXPECT_NE(error_of([&] { read_prompt_rows(jsonl); }).find("got an empty list"), std::string::npos);

  // The file itself: an unknown extension, a parquet name on something else, a missing file.
  EXPECT_NE(error_of([&] { read_prompt_rows(dir.file("train.csv")); }).find(dir.file("train.csv") + ": unknown data file type"),
            std::string::npos);
  const std::string fake = dir.file("fake.parquet");
  write_file_atomic(fake, "{\"prompt\": \"not parquet\"}\n");
  msg_text = error_of([&] { read_prompt_rows(fake); });
  EXPECT_NE(msg_text.find(fake + ": not a readable parquet file"), std::string::npos) << msg_text;
  EXPECT_NE(error_of([&] { read_prompt_rows(dir.file("missing.parquet")); }).find("no such file"), std::string::npos);
}

TEST(PromptRows, TaskExamplesBecomeVerlRows) {
  const auto task = make_task("addition");
  const Json row = verl_row(*task, Example{"12+34=", "46"}, "train", 3);
  EXPECT_EQ(row.dump(), R"({"data_source":"addition","prompt":[{"role":"user","content":"What is 12+34? Answer with the )"
                        R"(number only."}],"reward_model":{"style":"rule","ground_truth":"46"},"extra_info":{"split":"train","index":3}})");
  const PromptRow parsed = parse_prompt_row(row, "x", "column");
  EXPECT_EQ(parsed.answer, "46");
  EXPECT_EQ(parsed.data_source, "addition");
  for (const auto& name : task_names()) {
    const auto t = make_task(name);
    std::mt19937_64 rng(1);
    EXPECT_FALSE(task_question(*t, t->sample(rng)).empty()) << name;
  }
}

// verl's agent fields: agent_name top-level (as verl's dataset has it) or in extra_info, tools_kwargs and
// interaction_kwargs in extra_info (where verl's preprocessing scripts write them) or top-level; a top-level
// column wins, null is absent, and a wrong type names the row and the field.
TEST(PromptRows, ReadsTheAgentFieldsTopLevelOrInExtraInfo) {
  const Json base = Json::parse(R"({"prompt": [{"role": "user", "content": "2*3?"}],
                                    "reward_model": {"style": "rule", "ground_truth": "6"}})");
  Json row = base;
  row["agent_name"] = "tool_agent";
  row["extra_info"] = Json::parse(R"({"index": 0, "agent_name": "other", "interaction_kwargs": null,
                                      "tools_kwargs": {"calculator": {"create_kwargs": {"ground_truth": "6"}}}})");
  PromptRow parsed = parse_prompt_row(row, "f: row 0", "column");
  EXPECT_EQ(parsed.agent_name, "tool_agent");
  EXPECT_EQ(parsed.tools_kwargs.dump(), R"({"calculator":{"create_kwargs":{"ground_truth":"6"}}})");
  EXPECT_EQ(parsed.interaction_kwargs, Json::object());

  row = base;
  row["interaction_kwargs"] = Json::parse(R"({"name": "check", "ground_truth": "6"})");
  row["extra_info"] = Json::parse(R"({"agent_name": "tool_agent", "interaction_kwargs": {"name": "other"}})");
  parsed = parse_prompt_row(row, "f: row 0", "column");
  EXPECT_EQ(parsed.agent_name, "tool_agent");
  EXPECT_EQ(parsed.interaction_kwargs.at("name"), "check");
  EXPECT_EQ(parsed.tools_kwargs, Json::object());

  parsed = parse_prompt_row(base, "f: row 0", "column");  // a single-turn row
  EXPECT_EQ(parsed.agent_name, "");

  row = base;
  row["extra_info"] = Json::parse(R"({"tools_kwargs": [1, 2]})");
  EXPECT_NE(error_of([&] { parse_prompt_row(row, "f: row 4", "column"); })
                .find("f: row 4: column 'extra_info.tools_kwargs' must be an object, got array"),
            std::string::npos);
  row = base;
  row["agent_name"] = 7;
  EXPECT_NE(error_of([&] { parse_prompt_row(row, "f.jsonl:2", "key"); })
                .find("f.jsonl:2: key 'agent_name' must be a string"),
            std::string::npos);
}

}  // namespace
}  // namespace hybridflow
