#include "text/jinja_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "text/jinja_unicode.h"

namespace hybridflow::text::jinja {
namespace {

void append_escaped(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  auto hex4 = [&out](unsigned v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "\\u%04x", v & 0xFFFFu);
    out += buf;
  };
  auto escape_byte = [&](unsigned char c) -> bool {
    switch (c) {
      case '"': out += "\\\""; return true;
      case '\\': out += "\\\\"; return true;
      case '\n': out += "\\n"; return true;
      case '\r': out += "\\r"; return true;
      case '\t': out += "\\t"; return true;
      case '\b': out += "\\b"; return true;
      case '\f': out += "\\f"; return true;
      default:
        if (c < 0x20) {
          hex4(c);
          return true;
        }
        return false;
    }
  };
  if (!ensure_ascii) {
    for (char ch : s)
      if (!escape_byte(static_cast<unsigned char>(ch))) out.push_back(ch);
  } else {
    for (char32_t c : decode_utf8(s)) {
      if (c < 0x80) {
        if (!escape_byte(static_cast<unsigned char>(c))) out.push_back(static_cast<char>(c));
      } else if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        hex4(0xD800 + (v >> 10));
        hex4(0xDC00 + (v & 0x3FF));
      } else {
        hex4(c);
      }
    }
  }
  out.push_back('"');
}

class Dumper {
 public:
  explicit Dumper(const JsonDumpOptions& o) : o_(o) {
    item_sep_ = o.item_separator ? *o.item_separator : (o.indent ? "," : ", ");
    key_sep_ = o.key_separator ? *o.key_separator : ": ";
  }

  void dump(const Value& v, int depth, std::string& out) {
    switch (v.kind()) {
      case Value::Kind::None:
        out += "null";
        return;
      case Value::Kind::Bool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::Int:
        out += std::to_string(v.as_int());
        return;
      case Value::Kind::Float: {
        const double d = v.as_float();
        if (std::isnan(d)) out += "NaN";
        else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
        else out += format_float(d);
        return;
      }
      case Value::Kind::String:
        append_escaped(out, v.as_string(), o_.ensure_ascii);
        return;
      case Value::Kind::List: {
        const auto& items = v.as_list().items;
        if (items.empty()) {
          out += "[]";
          return;
        }
        out += "[";
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) out += item_sep_;
          newline(depth + 1, out);
          dump(items[i], depth + 1, out);
        }
        newline(depth, out);
        out += "]";
        return;
      }
      case Value::Kind::Dict: {
        std::vector<const std::pair<std::string, Value>*> entries;
        for (const auto& e : v.as_dict().entries) entries.push_back(&e);
        if (entries.empty()) {
          out += "{}";
          return;
        }
        if (o_.sort_keys)
          std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
        out += "{";
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i > 0) out += item_sep_;
          newline(depth + 1, out);
          append_escaped(out, entries[i]->first, o_.ensure_ascii);
          out += key_sep_;
          dump(entries[i]->second, depth + 1, out);
        }
        newline(depth, out);
        out += "}";
        return;
      }
      default:
        require_defined(v);
        throw EvalFailure("Object of type " + type_name(v) + " is not JSON serializable");
    }
  }

 private:
  void newline(int depth, std::string& out) const {
    if (!o_.indent) return;
    out.push_back('\n');
    for (int i = 0; i < depth; ++i) out += *o_.indent;
  }

  const JsonDumpOptions& o_;
  std::string item_sep_;
  std::string key_sep_;
};

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  Dumper(options).dump(v, 0, out);
  return out;
}

}  // namespace hybridflow::text::jinja
