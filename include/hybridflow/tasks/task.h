// Built-in tasks with verifiable answers: prompts sampled from a seeded generator, a reference
// answer, and a rule that scores a model's response. They feed SFT data, reward-model preference
// pairs and the rule rewards of RL.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

namespace hybridflow {

struct Example {
  std::string prompt;
  std::string answer;
};

struct TaskOptions {
  int min_digits = 1;           // addition: operand digit range; sort: length range
  int max_digits = 3;
  int min_length = 3;           // reverse / sort: string length range
  int max_length = 6;
  bool reversed_answer = false;  // addition: answer written least-significant digit first (easier for tiny models)
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  // Every character a prompt or answer can contain: what a character tokenizer needs.
  virtual std::string alphabet() const = 0;
  virtual Example sample(std::mt19937_64& rng) const = 0;
  // 1.0 when the response, with surrounding whitespace removed, equals the answer exactly; else 0.0.
  // No partial credit: the rewards stay verifiable and unambiguous.
  virtual double score(const std::string& response, const Example& example) const;
  // A wrong answer of the same shape (one character replaced by another of its kind), for the
  // "rejected" side of preference pairs. Never equal to the answer.
  virtual std::string corrupt(const std::string& answer, std::mt19937_64& rng) const;
};

// "addition", "addition_reversed" (= addition with reversed_answer), "reverse", "sort".
// An unknown name -> hybridflow::Error listing the valid names.
std::unique_ptr<Task> make_task(const std::string& name, const TaskOptions& options = {});
std::vector<std::string> task_names();

}  // namespace hybridflow
