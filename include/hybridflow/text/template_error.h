// TemplateError: what a chat template (Jinja) parse or render failure throws. It is a hybridflow::Error
// (so callers that catch the project's one user-error type still catch it) that also carries where in
// the template it happened, since a template is code the user did not write and must be debugged by line.
#pragma once

#include <string>

#include "hybridflow/core/error.h"

namespace hybridflow::text {

class TemplateError : public Error {
 public:
  // line and column are 1-based; 0 means the error has no template position (e.g. a bad config file).
  TemplateError(std::string message, int line, int column)
      : Error(format(message, line, column)), message_(std::move(message)), line_(line), column_(column) {}
  explicit TemplateError(std::string message) : TemplateError(std::move(message), 0, 0) {}

  // The message without the position: for raise_exception(msg) it is exactly the template's msg.
  const std::string& message() const { return message_; }
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  static std::string format(const std::string& message, int line, int column) {
    if (line <= 0) return "template error: " + message;
    return "template error at line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + message;
  }
  std::string message_;
  int line_;
  int column_;
};

}  // namespace hybridflow::text
