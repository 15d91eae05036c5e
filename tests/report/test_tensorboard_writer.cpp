// TensorBoard event files: CRC32C and TFRecord framing against known values, then files written by
// TensorBoardWriter read back by the `tensorboard` Python package (tests/report/read_events.py), which must
// find exactly the scalars (as float32) and texts written.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/report/crc32c.h"
#include "hybridflow/report/protobuf_encoder.h"
#include "hybridflow/report/tensorboard_export.h"
#include "hybridflow/report/tensorboard_writer.h"
#include "hybridflow/report/tfrecord.h"
#include "python_oracle.h"
#include "support/temp_dir.h"

namespace hybridflow::report {
namespace {

using hybridflow::testing::TempDir;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);  // RFC 3720 B.4: 32 bytes of 0xff
  // Computing in pieces gives the same CRC as in one go.
  EXPECT_EQ(crc32c("6789", crc32c("12345")), 0xE3069283u);
}

TEST(Crc32c, MaskRoundTrips) {
  for (uint32_t crc : {0u, 1u, 0xE3069283u, 0xffffffffu}) EXPECT_EQ(unmask_crc(mask_crc(crc)), crc);
  EXPECT_EQ(mask_crc(0), 0xa282ead8u);
}

TEST(ProtobufEncoder, EncodesWireFormat) {
  ProtobufEncoder e;
  e.varint_field(2, 300);  // tag 0x10, 300 = 0xac 0x02
  EXPECT_EQ(e.bytes(), std::string("\x10\xac\x02", 3));
  ProtobufEncoder neg;
  neg.varint_field(2, static_cast<uint64_t>(int64_t{-1}));  // int64 -1: ten bytes
  EXPECT_EQ(neg.bytes().size(), 11u);
  ProtobufEncoder s;
  s.bytes_field(1, "abc").float_field(2, 1.0f);
  EXPECT_EQ(s.bytes(), std::string("\x0a\x03" "abc" "\x15\x00\x00\x80\x3f", 10));
}

TEST(TfRecord, FramesAndReadsBack) {
  const std::string framed = frame_tfrecord("hello") + frame_tfrecord("") + frame_tfrecord(std::string(1000, 'x'));
  EXPECT_EQ(framed.size(), 3 * 16 + 5 + 0 + 1000);
  const std::vector<std::string> records = read_tfrecords(framed, "mem");
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0], "hello");
  EXPECT_EQ(records[1], "");
  EXPECT_EQ(records[2], std::string(1000, 'x'));
}

TEST(TfRecord, CorruptedLengthIsAnErrorNamingTheOffset) {
  std::string framed = frame_tfrecord("hello") + frame_tfrecord("world");
  framed[21] = '\x07';  // the second record's length: now 7, which its CRC does not match
  try {
    read_tfrecords(framed, "events.bin");
    FAIL() << "no error";
  } catch (const hybridflow::Error& e) {
    EXPECT_NE(std::string(e.what()).find("events.bin: record at byte 21 has a corrupted length"), std::string::npos)
        << e.what();
  }
}

TEST(TfRecord, CorruptedDataAndCutOffAreErrors) {
  std::string framed = frame_tfrecord("hello");
  std::string bad = framed;
  bad[13] = 'j';
  EXPECT_THROW(read_tfrecords(bad, "f"), hybridflow::Error);
  EXPECT_THROW(read_tfrecords(framed.substr(0, framed.size() - 1), "f"), hybridflow::Error);
  EXPECT_THROW(read_tfrecords(framed.substr(0, 5), "f"), hybridflow::Error);
}

TEST(TensorBoardWriter, FileNameAndFirstRecord) {
  TempDir dir;
  TensorBoardWriter writer(dir.file("tb"));
  const std::string name = std::filesystem::path(writer.path()).filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  const std::vector<std::string> records = read_tfrecords(read_all(writer.path()), writer.path());
  ASSERT_EQ(records.size(), 1u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
}

TEST(TensorBoardWriter, EveryCallIsOnDiskAtOnce) {
  TempDir dir;
  TensorBoardWriter writer(dir.path());
  writer.add_scalar("a", 1.0, 1);
  EXPECT_EQ(read_tfrecords(read_all(writer.path()), writer.path()).size(), 2u);
  writer.add_text("t", "x", 1);
  EXPECT_EQ(read_tfrecords(read_all(writer.path()), writer.path()).size(), 3u);
}

struct Written {
  std::vector<std::tuple<std::string, int64_t, float>> scalars;
  std::vector<std::tuple<std::string, int64_t, std::string>> texts;
};

float json_number(const nlohmann::json& v) {
  if (v.is_string()) {
    if (v == "nan") return std::numeric_limits<float>::quiet_NaN();
    return v == "inf" ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(v.get<double>());
}

TEST(TensorBoardWriter, TensorBoardReadsBackExactlyWhatWasWritten) {
  TempDir dir;
  const std::string logdir = dir.file("tb");
  Written w;
  {
    TensorBoardWriter first(logdir);
    for (int64_t step = 1; step <= 5; ++step) {
      const double score = 0.1 * static_cast<double>(step) + 1e-9;  // not exact in float32: checks the rounding
      first.add_scalar("score/mean", score, step);
      w.scalars.emplace_back("score/mean", step, static_cast<float>(score));
      std::map<std::string, double> metrics = {{"actor/entropy", 2.0 / static_cast<double>(step)},
                                               {"timing/step_s", 12.5 * static_cast<double>(step)}};
      first.add_scalars(metrics, step);
      for (const auto& [tag, value] : metrics) w.scalars.emplace_back(tag, step, static_cast<float>(value));
    }
    const std::string sample = "**prompt**: 1+1=?\n\n**response**: `2` <b>ünïcödé</b> ✓";
    first.add_text("samples", sample, 3);
    w.texts.emplace_back("samples", 3, sample);
  }
  {
    // A second process start (a resumed run) writes a second file that TensorBoard merges with the first.
    TensorBoardWriter second(logdir);
    second.add_scalar("score/mean", std::nan(""), 6);
    second.add_scalar("actor/entropy", std::numeric_limits<double>::infinity(), 6);
    second.add_scalar("timing/step_s", -1e300, 6);  // beyond float32: -inf, and no crash
    w.scalars.emplace_back("score/mean", 6, std::numeric_limits<float>::quiet_NaN());
    w.scalars.emplace_back("actor/entropy", 6, std::numeric_limits<float>::infinity());
    w.scalars.emplace_back("timing/step_s", 6, -std::numeric_limits<float>::infinity());
    second.add_scalar("big_step", 3.0, int64_t{1} << 40);
    w.scalars.emplace_back("big_step", int64_t{1} << 40, 3.0f);
    second.add_text("samples", "", 7);
    w.texts.emplace_back("samples", 7, "");
  }

  const auto r = hybridflow::testing::run_report_script("read_events.py", hybridflow::testing::shell_quote(logdir),
                                                        dir.path());
  ASSERT_EQ(r.exit_code, 0);
  const nlohmann::json got = nlohmann::json::parse(r.output);
  EXPECT_EQ(got["files"].size(), 2u) << got["files"];
  for (const auto& v : got["file_versions"]) EXPECT_EQ(v, "brain.Event:2");

  // Scalars, as EventAccumulator and as the server's plugin_event_accumulator read them: compared as float32
  // (NaN equal to NaN), in any order.
  auto key = [](const std::string& tag, int64_t step) { return tag + "@" + std::to_string(step); };
  std::map<std::string, float> expected;
  for (const auto& [tag, step, value] : w.scalars) expected[key(tag, step)] = value;
  for (const char* reader : {"scalars", "server_scalars"}) {
    std::map<std::string, float> actual;
    for (const auto& s : got[reader]) actual[key(s[0], s[1].get<int64_t>())] = json_number(s[2]);
    ASSERT_EQ(actual.size(), expected.size()) << reader << ": " << got[reader];
    for (const auto& [k, value] : expected) {
      ASSERT_TRUE(actual.count(k)) << reader << ": " << k;
      if (std::isnan(value)) {
        EXPECT_TRUE(std::isnan(actual[k])) << reader << ": " << k;
      } else {
        EXPECT_EQ(actual[k], value) << reader << ": " << k;
      }
    }
  }

  ASSERT_EQ(got["texts"].size(), w.texts.size()) << got["texts"];
  for (size_t i = 0; i < w.texts.size(); ++i) {
    EXPECT_EQ(got["texts"][i][0], std::get<0>(w.texts[i]));
    EXPECT_EQ(got["texts"][i][1].get<int64_t>(), std::get<1>(w.texts[i]));
    EXPECT_EQ(got["texts"][i][2].get<std::string>(), std::get<2>(w.texts[i]));
  }
  EXPECT_EQ(got["text_plugin_tags"], nlohmann::json::array({"samples"}));
  EXPECT_EQ(got["server_text_tags"], nlohmann::json::array({"samples"}));
}

TEST(TensorBoardExport, RunDirectoryReadsBackInTensorBoard) {
  TempDir dir;
  const std::string run = dir.file("run");
  std::filesystem::create_directories(run);
  std::ofstream(run + "/metrics.jsonl") << "{\"step\": 1, \"score/mean\": 0.5, \"actor/entropy\": null}\n"
                                        << "{\"step\": 2, \"score/mean\": 0.75, \"actor/entropy\": 0.25}\n"
                                        << "{\"step\": 3, \"score/me";  // cut off: ignored
  std::ofstream(run + "/samples.jsonl")
      << nlohmann::json({{"step", 2}, {"prompt", "1+1="}, {"response", "<script>x</script> **2**\nnext"}, {"reward", 1.0}}).dump()
      << "\n";
  const TensorBoardExport e = export_run_to_tensorboard(run, dir.file("tb"));
  EXPECT_EQ(e.steps, 2u);
  EXPECT_EQ(e.scalars, 3u);  // the null entropy of step 1 is left out
  EXPECT_EQ(e.text_steps, 1u);

  const auto r = hybridflow::testing::run_report_script("read_events.py", hybridflow::testing::shell_quote(dir.file("tb")),
                                                        dir.path());
  ASSERT_EQ(r.exit_code, 0);
  const nlohmann::json got = nlohmann::json::parse(r.output);
  EXPECT_EQ(got["scalars"].size(), 3u) << got["scalars"];
  ASSERT_EQ(got["texts"].size(), 1u);
  EXPECT_EQ(got["texts"][0][1], 2);
  // The Text tab shows model output verbatim: escaped, inside a code block, not bold, not a script.
  const std::string html = got["texts"][0][3];
  EXPECT_NE(html.find("&lt;script&gt;x&lt;/script&gt; **2**\nnext"), std::string::npos) << html;
  EXPECT_EQ(html.find("<script"), std::string::npos) << html;
  EXPECT_EQ(html.find("<strong>2</strong>"), std::string::npos) << html;
}

TEST(TensorBoardWriter, UnwritableDirectoryIsAnError) {
  TempDir dir;
  std::ofstream(dir.file("file")) << "x";
  EXPECT_THROW(TensorBoardWriter(dir.file("file") + "/tb"), hybridflow::Error);
}

}  // namespace
}  // namespace hybridflow::report
