// A value inside a JSON document together with its path ("pre_tokenizer.pretokenizers[1].type")
// and the file it came from, so that every load error can say exactly where and what.
#pragma once

#include <nlohmann/json.hpp>

#include <initializer_list>
#include <string>

#include "hybridflow/core/error.h"

namespace hybridflow::text {

class JsonNode {
 public:
  JsonNode(const nlohmann::json& value, std::string path, const std::string& file)
      : value_(&value), path_(std::move(path)), file_(&file) {}

  const nlohmann::json& value() const { return *value_; }
  const std::string& path() const { return path_; }
  bool is_null() const { return value_->is_null(); }

  // A field that must be present (null allowed only where the caller checks it).
  JsonNode at(const std::string& key) const {
    if (!value_->is_object()) fail("must be an object, got " + shown());
    auto it = value_->find(key);
    if (it == value_->end()) child(key, *value_).fail("missing field");
    return child(key, *it);
  }
  // Present and not null.
  bool has(const std::string& key) const {
    if (!value_->is_object()) return false;
    auto it = value_->find(key);
    return it != value_->end() && !it->is_null();
  }
  JsonNode operator[](size_t index) const {
    return JsonNode((*value_)[index], path_ + "[" + std::to_string(index) + "]", *file_);
  }
  size_t size() const {
    if (!value_->is_array()) fail("must be an array, got " + shown());
    return value_->size();
  }

  std::string str() const {
    if (!value_->is_string()) fail("must be a string, got " + shown());
    return value_->get<std::string>();
  }
  bool boolean() const {
    if (!value_->is_boolean()) fail("must be true or false, got " + shown());
    return value_->get<bool>();
  }
  int64_t integer() const {
    if (!value_->is_number_integer()) fail("must be an integer, got " + shown());
    return value_->get<int64_t>();
  }
  // Optional fields with their defaults.
  std::string str_or(const std::string& key, const std::string& fallback) const {
    return has(key) ? at(key).str() : fallback;
  }
  bool bool_or(const std::string& key, bool fallback) const { return has(key) ? at(key).boolean() : fallback; }

  // Fails on a field not in `known`: an option this implementation does not know could change the
  // encoding, so it is an error rather than ignored.
  void expect_only(std::initializer_list<const char*> known) const {
    if (!value_->is_object()) return;
    for (auto it = value_->begin(); it != value_->end(); ++it) {
      bool found = false;
      for (const char* k : known) found = found || it.key() == k;
      if (found) continue;
      std::string list;
      for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      child(it.key(), it.value()).fail("unsupported option (this component reads: " + list + ")");
    }
  }

  // The value, shortened for a message.
  std::string shown() const {
    std::string s = value_->dump();
    return s.size() > 80 ? s.substr(0, 77) + "..." : s;
  }
  [[noreturn]] void fail(const std::string& message) const {
    HF_FAIL(*file_, ": ", path_.empty() ? "(top level)" : path_, ": ", message);
  }

 private:
  JsonNode child(const std::string& key, const nlohmann::json& v) const {
    return JsonNode(v, path_.empty() ? key : path_ + "." + key, *file_);
  }
  const nlohmann::json* value_;
  std::string path_;
  const std::string* file_;
};

}  // namespace hybridflow::text
