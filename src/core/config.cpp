#include "hybridflow/core/config.h"
#include "hybridflow/core/config_json.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <regex>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"

namespace hybridflow {

namespace {

// Our own value tree instead of YAML::Node: yaml-cpp nodes alias on assignment and create entries on
// lookup, which makes merging error-prone; this tree also remembers where each value came from.
struct Value {
  enum class Type { kNull, kScalar, kList, kMap };
  Type type = Type::kNull;
  std::string text;     // scalar text as written
  bool quoted = false;  // quoted in the source, or known to be a string: always a string, never a number
  std::vector<Value> items;
  std::vector<std::pair<std::string, Value>> entries;  // map entries in document order
  std::string origin;      // "defaults:2:3", "file.yaml:3:5", "command line: a.b=1"
  std::string key_origin;  // where the key naming this value was written (for unknown-key errors)

  const Value* find(const std::string& key) const {
    for (const auto& kv : entries)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
  Value* find(const std::string& key) {
    for (auto& kv : entries)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
  Value& get_or_add(const std::string& key) {
    if (Value* v = find(key)) return *v;
    entries.emplace_back(key, Value{});
    return entries.back().second;
  }
};

Value empty_map() {
  Value v;
  v.type = Value::Type::kMap;
  return v;
}

// What a default says about the values its key accepts.
enum class Kind { kAny, kRequired, kInt, kFloat, kBool, kString, kList, kMap, kOpenMap };

const std::regex& int_pattern() {
  static const std::regex re("[-+]?[0-9]+");
  return re;
}
const std::regex& float_pattern() {
  static const std::regex re(
      "[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN)");
  return re;
}
bool is_int_text(const std::string& s) { return std::regex_match(s, int_pattern()); }
bool is_float_text(const std::string& s) { return std::regex_match(s, float_pattern()); }
bool parse_bool_text(const std::string& s, bool* out) {
  if (s == "true" || s == "True" || s == "TRUE") return *out = true, true;
  if (s == "false" || s == "False" || s == "FALSE") return (*out = false), true;
  return false;
}
bool is_bool_text(const std::string& s) {
  bool unused;
  return parse_bool_text(s, &unused);
}

Kind scalar_kind(const Value& v) {
  if (v.quoted) return Kind::kString;
  if (v.text == "???") return Kind::kRequired;
  if (is_bool_text(v.text)) return Kind::kBool;
  if (is_int_text(v.text)) return Kind::kInt;
  if (is_float_text(v.text)) return Kind::kFloat;
  return Kind::kString;
}

Kind kind_of(const Value& schema) {
  switch (schema.type) {
    case Value::Type::kNull: return Kind::kAny;
    case Value::Type::kScalar: return scalar_kind(schema);
    case Value::Type::kList: return Kind::kList;
    case Value::Type::kMap: return schema.entries.empty() ? Kind::kOpenMap : Kind::kMap;
  }
  return Kind::kAny;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kAny: return "any value";
    case Kind::kRequired: return "a value";
    case Kind::kInt: return "an integer";
    case Kind::kFloat: return "a number";
    case Kind::kBool: return "a boolean (true/false)";
    case Kind::kString: return "a string";
    case Kind::kList: return "a list";
    case Kind::kMap:
    case Kind::kOpenMap: return "a map";
  }
  return "?";
}

std::string describe(const Value& v) {
  switch (v.type) {
    case Value::Type::kNull: return "null";
    case Value::Type::kScalar: return "'" + v.text + "'";
    case Value::Type::kList: return "a list";
    case Value::Type::kMap: return "a map";
  }
  return "?";
}

std::string join_key(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

std::string mark_origin(const std::string& source, const YAML::Mark& mark) {
  if (mark.line < 0) return source;
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

Value from_yaml(const YAML::Node& node, const std::string& source) {
  Value v;
  v.origin = mark_origin(source, node.Mark());
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null: v.type = Value::Type::kNull; break;
    case YAML::NodeType::Scalar:
      v.type = Value::Type::kScalar;
      v.text = node.Scalar();
      v.quoted = node.Tag() == "!";  // yaml-cpp tags quoted scalars "!" and plain ones "?"
      break;
    case YAML::NodeType::Sequence:
      v.type = Value::Type::kList;
      for (const auto& item : node) v.items.push_back(from_yaml(item, source));
      break;
    case YAML::NodeType::Map:
      v.type = Value::Type::kMap;
      for (const auto& kv : node) {
        HF_CHECK(kv.first.IsScalar(), mark_origin(source, kv.first.Mark()), ": config keys must be plain names");
        std::string key = kv.first.Scalar();
        HF_CHECK(v.find(key) == nullptr, mark_origin(source, kv.first.Mark()), ": duplicate config key '", key, "'");
        Value child = from_yaml(kv.second, source);
        // An empty value ("key:") has no mark of its own; point at its key instead.
        child.key_origin = mark_origin(source, kv.first.Mark());
        if (child.type == Value::Type::kNull) child.origin = child.key_origin;
        v.entries.emplace_back(key, std::move(child));
      }
      break;
  }
  return v;
}

Value parse_yaml(const std::string& text, const std::string& source) {
  try {
    return from_yaml(YAML::Load(text), source);
  } catch (const YAML::Exception& e) {
    HF_FAIL(mark_origin(source, e.mark), ": invalid YAML: ", e.msg);
  }
}

void collect_keys(const Value& v, const std::string& prefix, std::vector<std::string>* out) {
  for (const auto& [key, child] : v.entries) {
    std::string full = join_key(prefix, key);
    out->push_back(full);
    if (child.type == Value::Type::kMap) collect_keys(child, full, out);
  }
}

// "did you mean 'x'?" when some key is close; otherwise the valid keys at that level.
std::string suggestion(const Value& root, const std::string& root_prefix, const std::string& full_key,
                       const Value* level) {
  std::vector<std::string> keys;
  collect_keys(root, root_prefix, &keys);
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const auto& k : keys) {
    size_t d = edit_distance(full_key, k);
    if (d < best_distance) best_distance = d, best = k;
  }
  if (!best.empty() && best_distance <= std::max<size_t>(2, full_key.size() / 3))
    return "did you mean '" + best + "'?";
  if (level && !level->entries.empty()) {
    std::string names;
    for (const auto& kv : level->entries) names += (names.empty() ? "" : ", ") + kv.first;
    return "valid keys here: " + names;
  }
  return "no such key in the schema";
}

// Hydra's override prefixes: none sets a key, "+" adds one that does not exist, "++" sets or adds.
enum class OverrideMode { kSet, kAdd, kForce };

// `key` is `entry` or a key below it.
bool covers(const std::string& entry, const std::string& key) {
  return key.size() >= entry.size() && key.compare(0, entry.size(), entry) == 0 &&
         (key.size() == entry.size() || key[entry.size()] == '.');
}

// An ignored-key entry covers `key` as above; "**.name" covers a `name` segment at any depth.
bool ignored_covers(const std::string& entry, const std::string& key) {
  if (entry.rfind("**.", 0) != 0) return covers(entry, key);
  const std::string name = entry.substr(3);
  return key == name || (key.size() > name.size() && key.compare(key.size() - name.size(), name.size(), name) == 0 &&
                         key[key.size() - name.size() - 1] == '.');
}

bool equals_ignoring_case(const std::string& a, const std::string& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

struct Merger {
  const Value& schema_root;
  Value* root = nullptr;  // the resolved tree: an alias may land anywhere in it
  const KeyCompat* compat = nullptr;
  CompatReport* report = nullptr;

  [[noreturn]] void unknown(const std::string& full, const std::string& where, const Value* level,
                            const std::string& intro = "unknown config key") const {
    HF_FAIL(intro, " '", full, "' (", where, "); ", suggestion(schema_root, "", full, level));
  }

  // The schema's node for a dotted key; nullptr where the schema lacks it or it lies inside an open map.
  const Value* schema_at(const std::string& key) const {
    const Value* node = &schema_root;
    size_t start = 0;
    while (true) {
      size_t dot = key.find('.', start);
      if (kind_of(*node) != Kind::kMap) return nullptr;
      node = node->find(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (!node || dot == std::string::npos) return node;
      start = dot + 1;
    }
  }

  // A key the schema lacks, read through `compat`: set under its schema name, or dropped. False when
  // `compat` does not know it either (the caller reports it as unknown).
  bool try_foreign(const std::string& full, const Value& value, const std::string& where) const {
    if (!compat) return false;
    for (const auto& [from, to] : compat->aliases) {
      const Value* target_schema = from == full ? schema_at(to) : nullptr;
      if (!target_schema) continue;
      // The other tool's "unset": our default (again, where an earlier value set it), still marked a default.
      Value v = value.type == Value::Type::kNull ? *target_schema : value;
      // verl writes file lists where we take one file: a list of one is that file.
      if (kind_of(*target_schema) == Kind::kString && v.type == Value::Type::kList && v.items.size() == 1) {
        std::string origin = v.origin;
        v = v.items.front();
        v.origin = origin;
      }
      set_path(to, std::move(v), where, OverrideMode::kSet);
      if (report) report->renamed.emplace_back(full, to);
      return true;
    }
    for (const auto& ignored : compat->ignored) {
      if (!ignored_covers(ignored.key, full)) continue;
      if (value.type == Value::Type::kMap && !value.entries.empty()) {  // report the leaves the user wrote
        for (const auto& [key, child] : value.entries)
          try_foreign(join_key(full, key), child, child.origin.empty() ? where : child.origin);
        return true;
      }
      check_accepted(ignored, full, value, where);
      if (report && std::find(report->ignored.begin(), report->ignored.end(), full) == report->ignored.end())
        report->ignored.push_back(full);
      return true;
    }
    // A map on the way to known keys (verl's critic.model holding critic.model.path): look inside.
    if (value.type != Value::Type::kMap) return false;
    bool below = false;
    for (const auto& alias : compat->aliases) below = below || (alias.first != full && covers(full, alias.first));
    for (const auto& ignored : compat->ignored) below = below || (ignored.key != full && covers(full, ignored.key));
    // ("**." entries do not count: any map may hold a _target_, and an unknown map is better named whole.)
    if (!below) return false;
    for (const auto& [key, child] : value.entries) {
      std::string child_full = join_key(full, key);
      std::string child_where = child.origin.empty() ? where : child.origin;
      if (!try_foreign(child_full, child, child_where))
        unknown(child_full, child.key_origin.empty() ? child_where : child.key_origin, nullptr);
    }
    return true;
  }

  static void check_accepted(const KeyCompat::Ignored& ignored, const std::string& full, const Value& value,
                             const std::string& where) {
    if (ignored.accepted.empty() || value.type == Value::Type::kNull) return;
    std::string allowed;
    bool ok = false;
    size_t start = 0;
    while (start <= ignored.accepted.size()) {
      size_t bar = ignored.accepted.find('|', start);
      std::string option = ignored.accepted.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
      ok = ok || (value.type == Value::Type::kScalar && equals_ignoring_case(option, value.text));
      allowed += (allowed.empty() ? "" : ", ") + option;
      if (bar == std::string::npos) break;
      start = bar + 1;
    }
    HF_CHECK(ok, "config key '", full, "' = ", describe(value), " (", where, ") is not supported: hybridflow accepts ",
             allowed, (ignored.note.empty() ? "" : " ("), ignored.note, (ignored.note.empty() ? "" : ")"));
  }

  void check_scalar(Kind kind, Value& v, const std::string& full, const std::string& where) const {
    bool ok = false;
    bool b;
    if (v.type == Value::Type::kScalar) {
      switch (kind) {
        case Kind::kInt: ok = is_int_text(v.text); break;
        case Kind::kFloat: ok = is_int_text(v.text) || is_float_text(v.text); break;
        case Kind::kBool: ok = parse_bool_text(v.text, &b); break;
        case Kind::kString: ok = true, v.quoted = true; break;
        default: ok = true;
      }
    }
    HF_CHECK(ok, "config key '", full, "' expects ", kind_name(kind), ", got ", describe(v), " (", where, ")");
  }

  // Sets `target` (currently the default or an earlier value) from `value`, checked against `schema`.
  void assign(Value& target, const Value* schema, Value value, const std::string& full,
              const std::string& where) const {
    Kind kind = schema ? kind_of(*schema) : Kind::kAny;
    if (compat && compat->null_keeps_default && value.type == Value::Type::kNull && kind != Kind::kAny &&
        kind != Kind::kRequired)
      return;
    switch (kind) {
      case Kind::kMap:
      case Kind::kOpenMap:
        HF_CHECK(value.type == Value::Type::kMap, "config key '", full, "' expects a map, got ", describe(value),
                 " (", where, ")");
        if (target.type != Value::Type::kMap) target = empty_map();
        merge_map(target, kind == Kind::kMap ? schema : nullptr, value, full, where);
        return;
      case Kind::kList: {
        // One text where a list of texts is expected is that list of one (trainer.logger=console, as verl's
        // tracking takes it).
        if (value.type == Value::Type::kScalar && !schema->items.empty() &&
            kind_of(schema->items.front()) == Kind::kString && scalar_kind(value) == Kind::kString) {
          Value list;
          list.type = Value::Type::kList;
          list.origin = value.origin;
          list.items.push_back(std::move(value));
          value = std::move(list);
        }
        HF_CHECK(value.type == Value::Type::kList, "config key '", full, "' expects a list, got ",
                 describe(value), " (", where, ")");
        if (!schema->items.empty()) {
          Kind item_kind = kind_of(schema->items.front());
          for (size_t i = 0; i < value.items.size(); ++i) {
            Value& item = value.items[i];
            std::string item_key = full + "[" + std::to_string(i) + "]";
            if (item_kind == Kind::kMap || item_kind == Kind::kOpenMap || item_kind == Kind::kList) {
              bool ok = item.type == schema->items.front().type;
              HF_CHECK(ok, "config key '", item_key, "' expects ", kind_name(item_kind), ", got ", describe(item),
                       " (", where, ")");
            } else {
              check_scalar(item_kind, item, item_key, where);
            }
          }
        }
        break;
      }
      case Kind::kAny:
      case Kind::kRequired: break;
      default: check_scalar(kind, value, full, where);
    }
    target = std::move(value);
  }

  // schema == nullptr: an open map, any keys accepted.
  void merge_map(Value& target, const Value* schema, const Value& user, const std::string& prefix,
                 const std::string& where) const {
    for (const auto& [key, child] : user.entries) {
      std::string full = join_key(prefix, key);
      std::string child_where = child.origin.empty() ? where : child.origin;
      const Value* child_schema = schema ? schema->find(key) : nullptr;
      if (schema && !child_schema) {
        if (try_foreign(full, child, child_where)) continue;
        unknown(full, child.key_origin.empty() ? child_where : child.key_origin, schema);
      }
      assign(target.get_or_add(key), child_schema, child, full, child_where);
    }
  }

  // Sets the dotted `key`, walking schema and resolved tree together.
  void set_path(const std::string& key, Value value, const std::string& where, OverrideMode mode) const {
    const Value* schema = &schema_root;
    Value* target = root;
    std::string full;
    size_t start = 0;
    while (true) {
      size_t dot = key.find('.', start);
      std::string segment = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      HF_CHECK(!segment.empty(), "config key '", key, "' has an empty segment (", where, ")");
      full = join_key(full, segment);
      const Value* child_schema = nullptr;
      if (schema) {
        child_schema = schema->find(segment);
        if (!child_schema) {
          if (try_foreign(key, value, where)) return;
          unknown(full, where, schema,
                  mode == OverrideMode::kAdd ? "cannot add config key (only maps whose default is {} take new keys)"
                                             : "unknown config key");
        }
      }
      if (dot == std::string::npos) {
        HF_CHECK(mode != OverrideMode::kAdd || (!child_schema && !target->find(segment)), "'+", key,
                 "=...' adds a key, but config key '", full, "' already exists (", where, "); set it with ", key,
                 "=... or ++", key, "=...");
        assign(target->get_or_add(segment), child_schema, std::move(value), full, where);
        return;
      }
      Kind kind = child_schema ? kind_of(*child_schema) : Kind::kOpenMap;
      HF_CHECK(kind == Kind::kMap || kind == Kind::kOpenMap, "config key '", full,
               "' is not a map, so '", key, "' cannot be set (", where, ")");
      Value& next = target->get_or_add(segment);
      if (next.type != Value::Type::kMap) next = empty_map();
      target = &next;
      schema = kind == Kind::kMap ? child_schema : nullptr;
      start = dot + 1;
    }
  }

  void apply_override(const std::string& text) const {
    std::string where = "command line: " + text;
    size_t eq = text.find('=');
    HF_CHECK(eq != std::string::npos && eq > 0, "command-line override '", text,
             "' must look like key=value (e.g. trainer.total_steps=20)");
    std::string key = text.substr(0, eq);
    OverrideMode mode = OverrideMode::kSet;
    if (key.rfind("++", 0) == 0) {
      mode = OverrideMode::kForce, key = key.substr(2);
    } else if (key.rfind("+", 0) == 0) {
      mode = OverrideMode::kAdd, key = key.substr(1);
    }
    std::string value_text = text.substr(eq + 1);
    Value value;
    value.origin = where;
    if (!value_text.empty() && (value_text[0] == '[' || value_text[0] == '{' || value_text[0] == '"' ||
                                value_text[0] == '\'')) {
      value = parse_yaml(value_text, where);
      value.origin = where;
    } else if (value_text.empty()) {
      // Hydra: "key=" is the empty string ("key=null" is null).
      value.type = Value::Type::kScalar;
      value.quoted = true;
    } else if (!(value_text == "null" || value_text == "~" || value_text == "Null" || value_text == "NULL")) {
      // Taken literally (not parsed as YAML), so values like "run#1" or "a: b" stay intact.
      value.type = Value::Type::kScalar;
      value.text = value_text;
    }
    set_path(key, std::move(value), where, mode);
  }
};

void collect_missing(const Value& v, const std::string& prefix, std::vector<std::string>* out) {
  for (const auto& [key, child] : v.entries) {
    std::string full = join_key(prefix, key);
    if (child.type == Value::Type::kScalar && !child.quoted && child.text == "???") out->push_back(full);
    if (child.type == Value::Type::kMap) collect_missing(child, full, out);
  }
}

// Marks the defaults' texts as strings, as a value set over them is marked (check_scalar): to_yaml then writes
// both alike, and a saved config loads back to the same text.
void mark_strings_quoted(Value& v) {
  if (v.type == Value::Type::kScalar && scalar_kind(v) == Kind::kString) v.quoted = true;
  for (auto& item : v.items) mark_strings_quoted(item);
  for (auto& entry : v.entries) mark_strings_quoted(entry.second);
}

void emit(YAML::Emitter& out, const Value& v) {
  switch (v.type) {
    case Value::Type::kNull: out << YAML::Null; break;
    case Value::Type::kScalar:
      if (v.quoted) out << YAML::DoubleQuoted;
      out << v.text;
      break;
    case Value::Type::kList: {
      bool flat = std::all_of(v.items.begin(), v.items.end(), [](const Value& i) {
        return i.type != Value::Type::kMap && i.type != Value::Type::kList;
      });
      if (flat) out << YAML::Flow;
      out << YAML::BeginSeq;
      for (const auto& item : v.items) emit(out, item);
      out << YAML::EndSeq;
      break;
    }
    case Value::Type::kMap:
      if (v.entries.empty()) out << YAML::Flow;
      out << YAML::BeginMap;
      for (const auto& [key, child] : v.entries) {
        out << YAML::Key << key << YAML::Value;
        emit(out, child);
      }
      out << YAML::EndMap;
      break;
  }
}

}  // namespace

struct Config::Impl {
  Value root;
  std::string prefix;

  std::string full(const std::string& key) const { return join_key(prefix, key); }

  const Value& lookup(const std::string& key) const {
    const Value* v = &root;
    size_t start = 0;
    while (true) {
      size_t dot = key.find('.', start);
      std::string segment = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      const Value* next = v->type == Value::Type::kMap ? v->find(segment) : nullptr;
      if (!next) HF_FAIL("no config key '", full(key), "'; ", suggestion(root, prefix, full(key), v));
      v = next;
      if (dot == std::string::npos) return *v;
      start = dot + 1;
    }
  }

  [[noreturn]] void type_error(const std::string& key, const Value& v, const char* expected) const {
    HF_FAIL("config key '", full(key), "' expects ", expected, ", got ", describe(v), " (", v.origin, ")");
  }

  const Value& scalar(const std::string& key, const char* expected) const {
    const Value& v = lookup(key);
    if (v.type != Value::Type::kScalar) type_error(key, v, expected);
    return v;
  }

  int64_t to_int(const std::string& key, const Value& v) const {
    int64_t out = 0;
    if (v.type != Value::Type::kScalar || !is_int_text(v.text)) type_error(key, v, "an integer");
    const char* begin = v.text.data() + (v.text[0] == '+' ? 1 : 0);
    auto res = std::from_chars(begin, v.text.data() + v.text.size(), out);
    HF_CHECK(res.ec == std::errc(), "config key '", full(key), "' value ", v.text, " is out of the int64 range (",
             v.origin, ")");
    return out;
  }

  double to_double(const std::string& key, const Value& v) const {
    if (v.type != Value::Type::kScalar || !(is_int_text(v.text) || is_float_text(v.text)))
      type_error(key, v, "a number");
    std::string t = v.text;
    bool negative = !t.empty() && t[0] == '-';
    std::string body = (!t.empty() && (t[0] == '-' || t[0] == '+')) ? t.substr(1) : t;
    if (body == ".inf" || body == ".Inf" || body == ".INF")
      return negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    if (body == ".nan" || body == ".NaN" || body == ".NAN") return std::numeric_limits<double>::quiet_NaN();
    return std::strtod(t.c_str(), nullptr);
  }

  const Value& list(const std::string& key) const {
    const Value& v = lookup(key);
    if (v.type != Value::Type::kList) type_error(key, v, "a list");
    return v;
  }
};

Config::Config() : impl_(std::make_shared<Impl>(Impl{empty_map(), ""})) {}
Config::Config(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Config Config::load(const std::string& defaults_yaml, const std::string& user_file,
                    const std::vector<std::string>& overrides) {
  return load(defaults_yaml, user_file, overrides, KeyCompat{}, nullptr);
}

Config Config::load_from_string(const std::string& defaults_yaml, const std::string& user_yaml,
                                const std::string& source_name, const std::vector<std::string>& overrides) {
  return load_from_string(defaults_yaml, user_yaml, source_name, overrides, KeyCompat{}, nullptr);
}

Config Config::load(const std::string& defaults_yaml, const std::string& user_file,
                    const std::vector<std::string>& overrides, const KeyCompat& compat, CompatReport* report) {
  std::string user_text = user_file.empty() ? std::string() : read_file(user_file);
  return load_from_string(defaults_yaml, user_text, user_file, overrides, compat, report);
}

Config Config::load_from_string(const std::string& defaults_yaml, const std::string& user_yaml,
                                const std::string& source_name, const std::vector<std::string>& overrides,
                                const KeyCompat& compat, CompatReport* report) {
  Value schema = parse_yaml(defaults_yaml, "defaults");
  if (schema.type == Value::Type::kNull) schema.type = Value::Type::kMap;
  HF_CHECK(schema.type == Value::Type::kMap, "config defaults must be a YAML map at the top level");
  Value resolved = schema;
  mark_strings_quoted(resolved);
  Merger merger{schema, &resolved, &compat, report};
  std::string source = source_name.empty() ? "config" : source_name;
  Value user = parse_yaml(user_yaml, source);
  if (user.type != Value::Type::kNull) {
    HF_CHECK(user.type == Value::Type::kMap, user.origin, ": a config file must be a YAML map at the top level");
    merger.merge_map(resolved, &schema, user, "", source);
  }
  for (const auto& o : overrides) merger.apply_override(o);

  std::vector<std::string> missing;
  collect_missing(resolved, "", &missing);
  if (!missing.empty()) {
    std::string names;
    for (const auto& m : missing) names += (names.empty() ? "" : ", ") + ("'" + m + "'");
    HF_FAIL("missing required config key", missing.size() > 1 ? "s " : " ", names,
            ": set it in the config file or on the command line (", missing.front(), "=...)");
  }
  return Config(std::make_shared<Impl>(Impl{std::move(resolved), ""}));
}

template <>
int64_t Config::get<int64_t>(const std::string& key) const {
  return impl_->to_int(key, impl_->lookup(key));
}
template <>
int Config::get<int>(const std::string& key) const {
  int64_t v = get<int64_t>(key);
  HF_CHECK(v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max(), "config key '",
           impl_->full(key), "' value ", v, " does not fit in a 32-bit int");
  return static_cast<int>(v);
}
template <>
double Config::get<double>(const std::string& key) const {
  return impl_->to_double(key, impl_->lookup(key));
}
template <>
bool Config::get<bool>(const std::string& key) const {
  const Value& v = impl_->lookup(key);
  bool out = false;
  if (v.type != Value::Type::kScalar || !parse_bool_text(v.text, &out)) impl_->type_error(key, v, "a boolean");
  return out;
}
template <>
std::string Config::get<std::string>(const std::string& key) const {
  return impl_->scalar(key, "a string").text;
}
template <>
std::vector<std::string> Config::get<std::vector<std::string>>(const std::string& key) const {
  std::vector<std::string> out;
  for (const auto& item : impl_->list(key).items) {
    if (item.type != Value::Type::kScalar) impl_->type_error(key, item, "a list of strings");
    out.push_back(item.text);
  }
  return out;
}
template <>
std::vector<int64_t> Config::get<std::vector<int64_t>>(const std::string& key) const {
  std::vector<int64_t> out;
  for (const auto& item : impl_->list(key).items) out.push_back(impl_->to_int(key, item));
  return out;
}
template <>
std::vector<double> Config::get<std::vector<double>>(const std::string& key) const {
  std::vector<double> out;
  for (const auto& item : impl_->list(key).items) out.push_back(impl_->to_double(key, item));
  return out;
}

bool Config::has(const std::string& key) const {
  try {
    impl_->lookup(key);
    return true;
  } catch (const Error&) {
    return false;
  }
}

bool Config::is_null(const std::string& key) const {
  return has(key) && impl_->lookup(key).type == Value::Type::kNull;
}

std::string Config::origin(const std::string& key) const { return impl_->lookup(key).origin; }

bool Config::is_default(const std::string& key) const { return origin(key).rfind("defaults", 0) == 0; }

Config Config::subtree(const std::string& key) const {
  const Value& v = impl_->lookup(key);
  if (v.type != Value::Type::kMap) impl_->type_error(key, v, "a map");
  return Config(std::make_shared<Impl>(Impl{v, impl_->full(key)}));
}

std::vector<std::string> Config::keys() const {
  std::vector<std::string> out;
  for (const auto& kv : impl_->root.entries) out.push_back(kv.first);
  return out;
}

std::string Config::to_yaml() const {
  YAML::Emitter out;
  emit(out, impl_->root);
  return std::string(out.c_str()) + "\n";
}

const std::string& Config::prefix() const { return impl_->prefix; }

namespace {

nlohmann::ordered_json value_json(const Value& v) {
  switch (v.type) {
    case Value::Type::kNull: return nullptr;
    case Value::Type::kScalar: {
      bool b = false;
      if (v.quoted) return v.text;
      if (parse_bool_text(v.text, &b)) return b;
      if (is_int_text(v.text)) return std::stoll(v.text);
      if (is_float_text(v.text) && v.text.find_first_of("iInN") == std::string::npos) return std::stod(v.text);
      return v.text;
    }
    case Value::Type::kList: {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (const Value& item : v.items) out.push_back(value_json(item));
      return out;
    }
    case Value::Type::kMap: {
      nlohmann::ordered_json out = nlohmann::ordered_json::object();
      for (const auto& [key, item] : v.entries) out[key] = value_json(item);
      return out;
    }
  }
  return nullptr;
}

}  // namespace

struct ConfigAccess {
  static const Value& root(const Config& config) { return config.impl_->root; }
};

nlohmann::ordered_json config_to_json(const Config& config) { return value_json(ConfigAccess::root(config)); }

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace hybridflow
