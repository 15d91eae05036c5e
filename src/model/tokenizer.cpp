#include "hybridflow/model/tokenizer.h"

#include <nlohmann/json.hpp>

#include <climits>
#include <filesystem>
#include <string_view>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/text/tokenizer.h"

namespace hybridflow {

struct Tokenizer::Published {
  text::Tokenizer tokenizer;
  std::string tokenizer_json;  // the files as read, which save() writes back
  std::string config_json;     // empty when there was no tokenizer_config.json
  std::string generation_json;  // generation_config.json beside it, as read; empty when there was none
};

namespace {

using json = nlohmann::json;

const char* const kSpecialTokens[] = {"<pad>", "<s>", "</s>", "<unk>"};

// Splits UTF-8 text into characters (code points). Malformed sequences are an error rather than
// a silent byte fallback, so that encode/decode round trips exactly.
std::vector<std::string> utf8_chars(const std::string& text, const std::string& what) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    size_t len = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xe ? 3 : (lead >> 3) == 0x1e ? 4 : 0;
    HF_CHECK(len != 0 && i + len <= text.size(), what, ": invalid UTF-8 at byte offset ", i);
    for (size_t k = 1; k < len; ++k)
      HF_CHECK((static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80, what, ": invalid UTF-8 at byte offset ", i);
    out.push_back(text.substr(i, len));
    i += len;
  }
  return out;
}

std::string printable(const std::string& ch) {
  if (ch.size() == 1 && (static_cast<unsigned char>(ch[0]) < 0x20 || ch[0] == 0x7f)) {
    return "\\x" + std::string(1, "0123456789abcdef"[(ch[0] >> 4) & 0xf]) + "0123456789abcdef"[ch[0] & 0xf];
  }
  return ch;
}

json added_token(int64_t id, const std::string& content) {
  return {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},   {"normalized", false}, {"special", true}};
}

const json& field(const json& obj, const char* key, std::string_view where, const std::string& path) {
  HF_CHECK(obj.is_object() && obj.contains(key), path, ": missing field '", where, key, "'");
  return obj[key];
}

// Whether a tokenizer.json is one save() writes for a character-level tokenizer (its special tokens
// first, a Fuse decoder): those keep the strict loader below, which also reports what is broken in
// them; every other file goes through the text layer.
bool is_character_level_file(const json& doc) {
  if (!doc.is_object()) return false;
  auto added = doc.find("added_tokens");
  auto decoder = doc.find("decoder");
  return added != doc.end() && added->is_array() && !added->empty() && (*added)[0].is_object() &&
         (*added)[0].value("content", json()) == json(kSpecialTokens[0]) && decoder != doc.end() &&
         decoder->is_object() && decoder->value("type", json()) == json("Fuse");
}

// The id of tokenizer_config.json's `field` (a string or {"content": ...}); -1 when absent or null.
int64_t config_token_id(const json& config, const char* field, const text::Tokenizer& tok, const std::string& path) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) return -1;
  const json& value = it->is_object() ? it->value("content", json()) : *it;
  HF_CHECK(value.is_string(), path, ": field '", field, "' must be a token string or {\"content\": ...}, got ",
           it->dump());
  auto id = tok.token_to_id(value.get<std::string>());
  HF_CHECK(id.has_value(), path, ": field '", field, "' names ", value.dump(),
           ", which is not a token of tokenizer.json");
  return *id;
}

std::vector<int32_t> to_text_ids(const std::vector<int64_t>& ids, int64_t vocab_size) {
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (int64_t id : ids) {
    HF_CHECK(id >= 0 && id < vocab_size && id <= INT32_MAX, "token id ", id, " out of range [0, ", vocab_size, ")");
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

}  // namespace

Tokenizer Tokenizer::from_alphabet(const std::string& alphabet) {
  Tokenizer t;
  for (const char* s : kSpecialTokens) {
    t.token_to_id_[s] = static_cast<int64_t>(t.id_to_token_.size());
    t.id_to_token_.push_back(s);
  }
  for (const std::string& ch : utf8_chars(alphabet, "tokenizer alphabet")) {
    if (t.token_to_id_.count(ch)) continue;
    t.token_to_id_[ch] = static_cast<int64_t>(t.id_to_token_.size());
    t.id_to_token_.push_back(ch);
  }
  return t;
}

const std::string& Tokenizer::token(int64_t id) const {
  HF_CHECK(id >= 0 && id < vocab_size(), "token id ", id, " out of range [0, ", vocab_size(), ")");
  return id_to_token_[static_cast<size_t>(id)];
}

std::vector<int64_t> Tokenizer::encode(const std::string& text, bool add_bos) const {
  if (published_) {
    const std::vector<int32_t> ids = published_->tokenizer.encode(text, add_bos);
    return std::vector<int64_t>(ids.begin(), ids.end());
  }
  std::vector<int64_t> ids;
  ids.reserve(text.size() + 1);
  if (add_bos) ids.push_back(bos_id_);
  size_t offset = 0;
  for (const std::string& ch : utf8_chars(text, "tokenizer input")) {
    auto it = token_to_id_.find(ch);
    // Specials are tokens, not characters: "<s>" in text is three characters.
    HF_CHECK(it != token_to_id_.end() && it->second >= kNumSpecial, "tokenizer: character '", printable(ch),
             "' at byte offset ", offset, " is not in the vocabulary (", vocab_size() - kNumSpecial,
             " characters)");
    ids.push_back(it->second);
    offset += ch.size();
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  if (published_) return published_->tokenizer.decode(to_text_ids(ids, vocab_size()), skip_special);
  std::string out;
  for (int64_t id : ids) {
    const std::string& tok = token(id);
    if (skip_special && id < kNumSpecial) continue;
    out += tok;
  }
  return out;
}

const std::string& Tokenizer::source_generation_config() const {
  static const std::string kNone;
  return published_ ? published_->generation_json : kNone;
}

void Tokenizer::save(const std::string& path) const {
  if (published_) {
    write_file_atomic(path, published_->tokenizer_json);
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (!published_->config_json.empty())
      write_file_atomic((dir / "tokenizer_config.json").string(), published_->config_json);
    if (!published_->generation_json.empty())
      write_file_atomic((dir / "generation_config.json").string(), published_->generation_json);
    return;
  }
  json added = json::array();
  json vocab = json::object();
  for (int64_t id = 0; id < vocab_size(); ++id) {
    if (id < kNumSpecial) added.push_back(added_token(id, id_to_token_[static_cast<size_t>(id)]));
    vocab[id_to_token_[static_cast<size_t>(id)]] = id;
  }
  // Accepted by Hugging Face `tokenizers`: the Split pre-tokenizer isolates every character
  // ("[\s\S]" so that newlines match too), WordLevel maps each to its id, Fuse joins on decode.
  json doc = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Split"}, {"pattern", {{"Regex", "[\\s\\S]"}}}, {"behavior", "Isolated"}, {"invert", false}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "Fuse"}}},
      {"model", {{"type", "WordLevel"}, {"vocab", vocab}, {"unk_token", "<unk>"}}},
  };
  write_file_atomic(path, doc.dump(2) + "\n");
}

Tokenizer Tokenizer::load(const std::string& path) {
  json doc;
  std::string bytes = read_file(path);
  try {
    // Which loader a file needs is decided by its top-level fields without "model": a published model's
    // vocabulary is nearly all of its file (150k tokens), and building it as a JSON tree here, only for the
    // text layer to parse it again, was most of the start-up of `hybridflow tokenize`.
    doc = json::parse(bytes, [](int depth, json::parse_event_t event, json& parsed) {
      return !(event == json::parse_event_t::key && depth == 1 && parsed == "model");
    });
  } catch (const json::exception& e) {
    HF_FAIL(path, ": not valid JSON: ", e.what());
  }
  if (!is_character_level_file(doc)) return load_published(path, std::move(bytes));
  doc = json::parse(bytes);  // a character-level file: small, and checked field by field below
  HF_CHECK(doc.is_object(), path, ": tokenizer.json must be a JSON object");
  const json& version = field(doc, "version", "", path);
  HF_CHECK(version == "1.0", path, ": field 'version' must be \"1.0\", got ", version.dump());
  const json& model = field(doc, "model", "", path);
  const json& type = field(model, "type", "model.", path);
  HF_CHECK(type == "WordLevel", path, ": field 'model.type' must be \"WordLevel\" (character-level tokenizer), got ",
           type.dump());
  const json& vocab = field(model, "vocab", "model.", path);
  HF_CHECK(vocab.is_object() && !vocab.empty(), path, ": field 'model.vocab' must be a non-empty object");

  Tokenizer t;
  t.id_to_token_.assign(vocab.size(), std::string());
  std::vector<bool> filled(vocab.size(), false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    HF_CHECK(it.value().is_number_integer(), path, ": field 'model.vocab' entry '", it.key(),
             "' must be an integer id, got ", it.value().dump());
    const int64_t id = it.value().get<int64_t>();
    HF_CHECK(id >= 0 && id < static_cast<int64_t>(vocab.size()), path, ": field 'model.vocab' id ", id, " of '",
             it.key(), "' is outside [0, ", vocab.size(), "): ids must be dense");
    HF_CHECK(!filled[static_cast<size_t>(id)], path, ": field 'model.vocab' gives id ", id, " to both '",
             t.id_to_token_[static_cast<size_t>(id)], "' and '", it.key(), "'");
    filled[static_cast<size_t>(id)] = true;
    t.id_to_token_[static_cast<size_t>(id)] = it.key();
    t.token_to_id_[it.key()] = id;
  }
  for (int64_t id = 0; id < kNumSpecial; ++id)
    HF_CHECK(t.id_to_token_[static_cast<size_t>(id)] == kSpecialTokens[id], path, ": field 'model.vocab' must give id ",
             id, " to '", kSpecialTokens[id], "', found '", t.id_to_token_[static_cast<size_t>(id)], "'");
  for (int64_t id = kNumSpecial; id < t.vocab_size(); ++id) {
    const std::string& tok = t.id_to_token_[static_cast<size_t>(id)];
    HF_CHECK(utf8_chars(tok, path).size() == 1, path, ": field 'model.vocab' token '", tok,
             "' is not a single character (only character-level vocabularies are supported)");
  }
  const json& unk = field(model, "unk_token", "model.", path);
  HF_CHECK(unk == "<unk>", path, ": field 'model.unk_token' must be \"<unk>\", got ", unk.dump());

  const json& added = field(doc, "added_tokens", "", path);
  HF_CHECK(added.is_array(), path, ": field 'added_tokens' must be an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const std::string where = "added_tokens[" + std::to_string(i) + "].";
    const json& id = field(added[i], "id", where, path);
    const json& content = field(added[i], "content", where, path);
    HF_CHECK(id.is_number_integer() && content.is_string(), path, ": field '", where,
             "id/content' must be an integer and a string");
    HF_CHECK(id.get<int64_t>() < kNumSpecial && t.id_to_token_[static_cast<size_t>(id.get<int64_t>())] ==
                                                   content.get<std::string>(),
             path, ": field '", where, "' (", content.dump(), ", id ", id.dump(),
             ") does not match a special token of model.vocab");
  }
  HF_CHECK(added.size() == static_cast<size_t>(kNumSpecial), path, ": field 'added_tokens' must list the ",
           kNumSpecial, " special tokens <pad> <s> </s> <unk>, found ", added.size());
  const json& pre = field(doc, "pre_tokenizer", "", path);
  HF_CHECK(pre.is_object() && pre.value("type", "") == "Split", path,
           ": field 'pre_tokenizer.type' must be \"Split\" (one piece per character)");
  return t;
}

Tokenizer Tokenizer::load_published(const std::string& path, std::string bytes) {
  auto published = std::make_shared<Published>(
      Published{text::Tokenizer::from_json(bytes, path), std::move(bytes), std::string(), std::string()});
  const text::Tokenizer& tok = published->tokenizer;
  Tokenizer t;
  t.id_to_token_.resize(static_cast<size_t>(tok.vocab_size()));
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (auto token = tok.id_to_token(id)) t.id_to_token_[static_cast<size_t>(id)] = std::move(*token);
  }
  t.pad_id_ = t.bos_id_ = t.eos_id_ = t.unk_id_ = -1;
  const std::string config_path = (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  if (file_exists(config_path)) {
    published->config_json = read_file(config_path);
    json config;
    try {
      config = json::parse(published->config_json);
    } catch (const json::exception& e) {
      HF_FAIL(config_path, ": not valid JSON: ", e.what());
    }
    HF_CHECK(config.is_object(), config_path, ": must be a JSON object");
    t.pad_id_ = config_token_id(config, "pad_token", tok, config_path);
    t.bos_id_ = config_token_id(config, "bos_token", tok, config_path);
    t.eos_id_ = config_token_id(config, "eos_token", tok, config_path);
    t.unk_id_ = config_token_id(config, "unk_token", tok, config_path);
  }
  const std::string generation_path =
      (std::filesystem::path(path).parent_path() / "generation_config.json").string();
  if (file_exists(generation_path)) published->generation_json = read_file(generation_path);
  t.published_ = std::move(published);
  return t;
}

}  // namespace hybridflow
