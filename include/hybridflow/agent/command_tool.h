// A tool run as a program per call: the arguments as one JSON object on stdin, the result as text on
// stdout. Bounded like the reward command: a wall-clock limit and a byte limit on each output stream,
// past either its whole process group is killed. The row's tools_kwargs entry for the tool (if any) is
// in the environment as HF_TOOL_KWARGS (JSON). It runs in `working_dir` (the tool config file's directory
// when loaded from one).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/agent/tool.h"

namespace hybridflow::agent {

struct ProcessBounds {
  double timeout_s = 30;
  int64_t max_output_bytes = 1 << 20;
};

class CommandTool : public Tool {
 public:
  // argv[0] is looked up on PATH; no shell unless argv is {"/bin/sh", "-c", line}.
  CommandTool(Json schema, std::vector<std::string> argv, ProcessBounds bounds, const std::string& where,
              std::string working_dir = "");
  std::string describe() const override;

 protected:
  ToolResult run(const Json& arguments, const Json& kwargs) const override;

 private:
  std::vector<std::string> argv_;
  ProcessBounds bounds_;
  std::string working_dir_;
};

}  // namespace hybridflow::agent
