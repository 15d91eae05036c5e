#include "hybridflow/report/tensorboard_writer.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <limits>
#include <filesystem>

#include "hybridflow/core/error.h"
#include "hybridflow/report/tensorboard_event.h"
#include "hybridflow/report/tfrecord.h"

namespace hybridflow::report {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// events.out.tfevents.<unix seconds>.<hostname>; a second writer started in the same second (a quick
// restart, two writers in one process) gets a numbered suffix rather than appending to the first's file.
std::string new_event_file_path(const std::string& dir) {
  const auto seconds = static_cast<long long>(now_seconds());
  const std::string base = dir + "/events.out.tfevents." + std::to_string(seconds) + "." + hostname();
  std::string path = base;
  for (int n = 1; std::filesystem::exists(path); ++n) path = base + "." + std::to_string(n);
  return path;
}

// float32 as TensorBoard stores scalars; a finite double beyond float's range becomes an infinity
// explicitly (the plain conversion of such a value is undefined behaviour in C++).
float to_float32(double value) {
  constexpr double kMax = std::numeric_limits<float>::max();
  if (std::isfinite(value) && std::fabs(value) > kMax) {
    return value > 0 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(value);
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  HF_CHECK(!ec, "tensorboard: cannot create directory ", dir, ": ", ec.message());
  path_ = new_event_file_path(dir);
  out_.open(path_, std::ios::binary | std::ios::out);
  HF_CHECK(out_.is_open(), "tensorboard: cannot create event file ", path_);
  write_record(file_version_event(now_seconds()));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  // No throwing from a destructor; a failed final flush was already reported by the last add_*.
  out_.flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  write_event(summary_field(scalar_summary_value(tag, to_float32(value))), step);
}

void TensorBoardWriter::add_scalars(const std::map<std::string, double>& values, int64_t step) {
  if (values.empty()) return;
  std::string fields;
  for (const auto& [tag, value] : values) fields += summary_field(scalar_summary_value(tag, to_float32(value)));
  write_event(fields, step);
}

void TensorBoardWriter::add_text(const std::string& tag, std::string_view markdown, int64_t step) {
  write_event(summary_field(text_summary_value(tag, markdown)), step);
}

void TensorBoardWriter::write_event(const std::string& summary, int64_t step) {
  write_record(summary_event(now_seconds(), step, summary));
  flush();
}

void TensorBoardWriter::write_record(const std::string& event) {
  const std::string record = frame_tfrecord(event);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
}

void TensorBoardWriter::flush() {
  out_.flush();
  HF_CHECK(out_.good(), "tensorboard: cannot write to ", path_);
}

}  // namespace hybridflow::report
