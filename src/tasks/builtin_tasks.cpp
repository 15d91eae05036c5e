// The built-in tasks and their registry.
#include <algorithm>

#include "hybridflow/core/error.h"
#include "hybridflow/tasks/task.h"

namespace hybridflow {

namespace {

int draw(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// A number with exactly `digits` digits (no leading zero unless it is 0 itself).
std::string random_number(std::mt19937_64& rng, int digits) {
  std::string s(1, static_cast<char>('0' + draw(rng, digits == 1 ? 0 : 1, 9)));
  for (int i = 1; i < digits; ++i) s += static_cast<char>('0' + draw(rng, 0, 9));
  return s;
}

// Decimal addition on strings, so operands may have any number of digits.
std::string add_decimal(const std::string& a, const std::string& b) {
  std::string out;
  int carry = 0;
  for (size_t i = 0; i < std::max(a.size(), b.size()) || carry; ++i) {
    int d = carry;
    if (i < a.size()) d += a[a.size() - 1 - i] - '0';
    if (i < b.size()) d += b[b.size() - 1 - i] - '0';
    out += static_cast<char>('0' + d % 10);
    carry = d / 10;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

void check_range(const std::string& task, const char* what, int lo, int hi) {
  HF_CHECK(lo >= 1 && hi >= lo, "task '", task, "': ", what, " range [", lo, ", ", hi,
           "] must satisfy 1 <= min <= max");
}

// "12+345=" -> "357" (or "753" with reversed_answer).
class AdditionTask : public Task {
 public:
  explicit AdditionTask(const TaskOptions& o) : o_(o) { check_range(name(), "digits", o.min_digits, o.max_digits); }
  std::string name() const override { return o_.reversed_answer ? "addition_reversed" : "addition"; }
  std::string alphabet() const override { return "0123456789+="; }
  Example sample(std::mt19937_64& rng) const override {
    std::string a = random_number(rng, draw(rng, o_.min_digits, o_.max_digits));
    std::string b = random_number(rng, draw(rng, o_.min_digits, o_.max_digits));
    std::string sum = add_decimal(a, b);
    if (o_.reversed_answer) std::reverse(sum.begin(), sum.end());
    return {a + "+" + b + "=", sum};
  }

 private:
  TaskOptions o_;
};

// "abc=" -> "cba".
class ReverseTask : public Task {
 public:
  explicit ReverseTask(const TaskOptions& o) : o_(o) { check_range(name(), "length", o.min_length, o.max_length); }
  std::string name() const override { return "reverse"; }
  std::string alphabet() const override { return "abcdefghijklmnopqrstuvwxyz="; }
  Example sample(std::mt19937_64& rng) const override {
    std::string s;
    for (int i = draw(rng, o_.min_length, o_.max_length); i > 0; --i) s += static_cast<char>('a' + draw(rng, 0, 25));
    return {s + "=", std::string(s.rbegin(), s.rend())};
  }

 private:
  TaskOptions o_;
};

// "3141=" -> "1134".
class SortTask : public Task {
 public:
  explicit SortTask(const TaskOptions& o) : o_(o) { check_range(name(), "length", o.min_length, o.max_length); }
  std::string name() const override { return "sort"; }
  std::string alphabet() const override { return "0123456789="; }
  Example sample(std::mt19937_64& rng) const override {
    std::string s;
    for (int i = draw(rng, o_.min_length, o_.max_length); i > 0; --i) s += static_cast<char>('0' + draw(rng, 0, 9));
    std::string sorted = s;
    std::sort(sorted.begin(), sorted.end());
    return {s + "=", sorted};
  }

 private:
  TaskOptions o_;
};

}  // namespace

std::vector<std::string> task_names() { return {"addition", "addition_reversed", "reverse", "sort"}; }

std::unique_ptr<Task> make_task(const std::string& name, const TaskOptions& options) {
  if (name == "addition") return std::make_unique<AdditionTask>(options);
  if (name == "addition_reversed") {
    TaskOptions o = options;
    o.reversed_answer = true;
    return std::make_unique<AdditionTask>(o);
  }
  if (name == "reverse") return std::make_unique<ReverseTask>(options);
  if (name == "sort") return std::make_unique<SortTask>(options);
  std::string valid;
  for (const auto& n : task_names()) valid += (valid.empty() ? "" : ", ") + n;
  HF_FAIL("unknown task '", name, "'; valid tasks: ", valid);
}

}  // namespace hybridflow
