// Writes TensorBoard event files (scalars and text) without TensorFlow or a protobuf library, so that
// `tensorboard --logdir <dir>` shows a run live. Each writer starts a new file
// events.out.tfevents.<unix seconds>.<hostname> in `dir`, as TensorBoard expects one file per process
// start; a resumed run writes a second file next to the first and TensorBoard merges them.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <string_view>

namespace hybridflow::report {

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and the event file, whose first record is the file version. Throws
  // hybridflow::Error when the file cannot be created.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Every add_* call is written and flushed at once: a step takes seconds, and a crashed run then
  // still shows everything up to its last step. NaN and infinities are written as they are
  // (TensorBoard shows them); values are stored as float32, as TensorBoard's scalars are.
  void add_scalar(const std::string& tag, double value, int64_t step);
  // One event for all of a step's metrics.
  void add_scalars(const std::map<std::string, double>& values, int64_t step);
  // Markdown text (TensorBoard's Text tab renders it), e.g. a few rollout samples.
  void add_text(const std::string& tag, std::string_view markdown, int64_t step);
  void flush();

  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& summary, int64_t step);
  void write_record(const std::string& event);

  std::string path_;
  std::ofstream out_;
};

}  // namespace hybridflow::report
