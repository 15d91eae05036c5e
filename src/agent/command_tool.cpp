#include "hybridflow/agent/command_tool.h"

#include <cstring>

#include "hybridflow/core/error.h"
#include "hybridflow/core/subprocess.h"

namespace hybridflow::agent {
namespace command_tool_detail {

std::string stderr_tail_for_model(const std::string& err, size_t max = 1000) {
  if (err.empty()) return "";
  return "\n" + (err.size() <= max ? err : "..." + err.substr(err.size() - max));
}

}  // namespace command_tool_detail

using namespace command_tool_detail;

CommandTool::CommandTool(Json schema, std::vector<std::string> argv, ProcessBounds bounds, const std::string& where,
                         std::string working_dir)
    : Tool(std::move(schema), where), argv_(std::move(argv)), bounds_(bounds), working_dir_(std::move(working_dir)) {
  HF_CHECK(!argv_.empty() && !argv_[0].empty(), where, ": config.command: expected a non-empty list (argv)");
  HF_CHECK(bounds_.timeout_s > 0, where, ": config.timeout_s: expected > 0, got ", bounds_.timeout_s);
  HF_CHECK(bounds_.max_output_bytes > 0, where, ": config.max_output_bytes: expected > 0, got ",
           bounds_.max_output_bytes);
}

std::string CommandTool::describe() const { return describe_command(argv_); }

ToolResult CommandTool::run(const Json& arguments, const Json& kwargs) const {
  SubprocessOptions options;
  options.working_dir = working_dir_;
  if (!kwargs.is_null()) options.extra_env.push_back({"HF_TOOL_KWARGS", kwargs.dump()});
  SubprocessResult run = run_subprocess(argv_, arguments.dump() + "\n", bounds_.timeout_s,
                                        static_cast<size_t>(bounds_.max_output_bytes), options);
  const std::string who = "tool '" + name() + "'";
  if (run.output_exceeded)
    return ToolResult::error(ToolStatus::output_limit, who + " wrote more than " +
                                                           std::to_string(bounds_.max_output_bytes) + " bytes to " +
                                                           run.output_exceeded_stream + " and was stopped");
  if (run.timed_out)
    return ToolResult::error(ToolStatus::timed_out, who + " did not finish within " +
                                                        std::to_string(bounds_.timeout_s) + " s and was stopped");
  if (run.signaled)
    return ToolResult::error(ToolStatus::failed, who + " was killed by signal " + std::to_string(run.term_signal) +
                                                     " (" + strsignal(run.term_signal) + ")" +
                                                     stderr_tail_for_model(run.err));
  if (run.exit_code != 0)
    return ToolResult::error(ToolStatus::failed, who + " exited with status " + std::to_string(run.exit_code) +
                                                     stderr_tail_for_model(run.err));
  ToolResult result;
  result.text = run.out;
  while (!result.text.empty() && (result.text.back() == '\n' || result.text.back() == '\r')) result.text.pop_back();
  return result;
}

}  // namespace hybridflow::agent
