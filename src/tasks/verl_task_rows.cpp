// Built-in task examples as verl rows: what `hybridflow data --format parquet` writes, so that a chat model
// can be trained on a task with the same files verl would read.
#include "hybridflow/core/error.h"
#include "hybridflow/tasks/prompt_rows.h"

namespace hybridflow {

std::string task_question(const Task& task, const Example& example) {
  // Task prompts end in '=' ("12+34="); the question quotes what comes before it.
  std::string operand = example.prompt;
  if (!operand.empty() && operand.back() == '=') operand.pop_back();
  const std::string name = task.name();
  if (name == "addition") return "What is " + operand + "? Answer with the number only.";
  if (name == "addition_reversed")
    return "What is " + operand + "? Answer with the digits of the sum in reverse order (ones digit first), nothing else.";
  if (name == "reverse") return "Reverse the letters of \"" + operand + "\". Answer with the reversed letters only.";
  if (name == "sort") return "Sort the digits of " + operand + " in ascending order. Answer with the sorted digits only.";
  HF_FAIL("task '", name, "' has no question wording for chat data");
}

nlohmann::ordered_json verl_row(const Task& task, const Example& example, const std::string& split, int64_t index) {
  nlohmann::ordered_json row;
  row["data_source"] = task.name();
  row["prompt"] = nlohmann::ordered_json::array({{{"role", "user"}, {"content", task_question(task, example)}}});
  row["reward_model"] = {{"style", "rule"}, {"ground_truth", example.answer}};
  row["extra_info"] = {{"split", split}, {"index", index}};
  return row;
}

}  // namespace hybridflow
