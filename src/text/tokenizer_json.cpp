// Reads tokenizer.json into the pipeline's components. Every component type and option is checked:
// what is not implemented is an error naming the file, the JSON path and the value.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/text/tokenizer.h"
#include "text/bpe_model.h"
#include "text/json_node.h"
#include "text/tokenizer_impl.h"
#include "text/tokenizer_json_reader.h"

namespace hybridflow::text {
namespace {

using json = nlohmann::json;

[[noreturn]] void unknown_type(const JsonNode& type, const char* what, const char* supported) {
  type.fail(std::string("unsupported ") + what + " type " + type.shown() + " (supported: " + supported + ")");
}

// {"String": "..."} or {"Regex": "..."}: a regex for either (a literal is escaped) and the literal.
struct Pattern {
  std::string literal;
  std::unique_ptr<Regex> regex;  // set for a Regex pattern only
};

Pattern read_pattern(const JsonNode& node, bool compile_literal) {
  Pattern p;
  if (node.has("String")) {
    p.literal = node.at("String").str();
    if (compile_literal) p.regex = std::make_unique<Regex>(Regex::escape(p.literal));
  } else if (node.has("Regex")) {
    const JsonNode re = node.at("Regex");
    try {
      p.regex = std::make_unique<Regex>(re.str());
    } catch (const Error& e) {
      re.fail(e.what());
    }
  } else {
    node.fail("must be {\"String\": ...} or {\"Regex\": ...}, got " + node.shown());
  }
  return p;
}

std::unique_ptr<Normalizer> read_normalizer(const JsonNode& node) {
  const JsonNode type_node = node.at("type");
  const std::string type = type_node.str();
  static const std::set<std::string> kTypeOnly = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents"};
  if (kTypeOnly.count(type)) node.expect_only({"type"});
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Prepend") {
    node.expect_only({"type", "prepend"});
    return std::make_unique<PrependNormalizer>(node.at("prepend").str());
  }
  if (type == "Strip") {
    node.expect_only({"type", "strip_left", "strip_right"});
    return std::make_unique<StripNormalizer>(node.bool_or("strip_left", true), node.bool_or("strip_right", true));
  }
  if (type == "Replace") {
    node.expect_only({"type", "pattern", "content"});
    Pattern p = read_pattern(node.at("pattern"), false);
    const std::string content = node.at("content").str();
    if (p.regex) return std::make_unique<ReplaceNormalizer>(std::move(p.regex), content);
    return std::make_unique<ReplaceNormalizer>(p.literal, content);
  }
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "BertNormalizer") {
    node.expect_only({"type", "clean_text", "handle_chinese_chars", "strip_accents", "lowercase"});
    const bool lowercase = node.bool_or("lowercase", true);
    return std::make_unique<BertNormalizer>(node.bool_or("clean_text", true), node.bool_or("handle_chinese_chars", true),
                                            node.bool_or("strip_accents", lowercase), lowercase);
  }
  if (type == "Sequence") {
    node.expect_only({"type", "normalizers"});
    const JsonNode list = node.at("normalizers");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) steps.push_back(read_normalizer(list[i]));
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  unknown_type(type_node, "normalizer",
               "NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip, StripAccents, BertNormalizer, Sequence");
}

SplitBehavior read_behavior(const JsonNode& node) {
  const std::string b = node.str();
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  node.fail("unsupported split behavior " + node.shown() +
            " (supported: Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

// Metaspace's prepend_scheme, or for files older than that option, add_prefix_space.
PrependScheme read_prepend_scheme(const JsonNode& node) {
  if (node.has("prepend_scheme")) {
    const JsonNode s = node.at("prepend_scheme");
    const std::string v = s.str();
    if (v == "first") return PrependScheme::First;
    if (v == "always") return PrependScheme::Always;
    if (v == "never") return PrependScheme::Never;
    s.fail("unsupported prepend_scheme " + s.shown() + " (supported: first, always, never)");
  }
  return node.bool_or("add_prefix_space", true) ? PrependScheme::Always : PrependScheme::Never;
}

std::unique_ptr<PreTokenizer> read_pre_tokenizer(const JsonNode& node) {
  const JsonNode type_node = node.at("type");
  const std::string type = type_node.str();
  if (type == "ByteLevel") {
    node.expect_only({"type", "add_prefix_space", "trim_offsets", "use_regex"});  // trim_offsets: offsets only
    return std::make_unique<ByteLevelPreTokenizer>(node.bool_or("add_prefix_space", true),
                                                   node.bool_or("use_regex", true));
  }
  if (type == "Split") {
    node.expect_only({"type", "pattern", "behavior", "invert"});
    Pattern p = read_pattern(node.at("pattern"), true);
    return std::make_unique<SplitPreTokenizer>(std::move(p.regex), read_behavior(node.at("behavior")),
                                               node.bool_or("invert", false));
  }
  if (type == "Metaspace") {
    node.expect_only({"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
    return std::make_unique<MetaspacePreTokenizer>(node.str_or("replacement", "\xe2\x96\x81"),
                                                   read_prepend_scheme(node), node.bool_or("split", true));
  }
  if (type == "Digits") {
    node.expect_only({"type", "individual_digits"});
    return std::make_unique<CharSplitPreTokenizer>(
        CharSplitPreTokenizer::Kind::Digits,
        node.bool_or("individual_digits", false) ? SplitBehavior::Isolated : SplitBehavior::Contiguous);
  }
  if (type == "Whitespace" || type == "WhitespaceSplit" || type == "BertPreTokenizer") node.expect_only({"type"});
  if (type == "Whitespace")
    return std::make_unique<SplitPreTokenizer>(std::make_unique<Regex>(kWhitespaceWordPattern), SplitBehavior::Removed,
                                               /*invert=*/true);
  if (type == "WhitespaceSplit")
    return std::make_unique<CharSplitPreTokenizer>(CharSplitPreTokenizer::Kind::Whitespace, SplitBehavior::Removed);
  if (type == "Punctuation") {
    node.expect_only({"type", "behavior"});
    return std::make_unique<CharSplitPreTokenizer>(
        CharSplitPreTokenizer::Kind::Punctuation,
        node.has("behavior") ? read_behavior(node.at("behavior")) : SplitBehavior::Isolated);
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    steps.push_back(
        std::make_unique<CharSplitPreTokenizer>(CharSplitPreTokenizer::Kind::Whitespace, SplitBehavior::Removed));
    steps.push_back(
        std::make_unique<CharSplitPreTokenizer>(CharSplitPreTokenizer::Kind::Punctuation, SplitBehavior::Isolated));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Sequence") {
    node.expect_only({"type", "pretokenizers"});
    const JsonNode list = node.at("pretokenizers");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) steps.push_back(read_pre_tokenizer(list[i]));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  unknown_type(type_node, "pre-tokenizer",
               "ByteLevel, Split, Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer, "
               "Sequence");
}

Vocab read_vocab(const JsonNode& node) {
  if (!node.value().is_object()) node.fail("must be an object of token -> id, got " + node.shown());
  Vocab vocab;
  vocab.reserve(node.value().size());
  for (auto it = node.value().begin(); it != node.value().end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX)
      node.fail("entry '" + it.key() + "' must be a non-negative integer id, got " + it.value().dump());
    // Ids index a table, so a stray huge id would ask for gigabytes: gaps are fine, millions are not.
    if (it.value().get<int64_t>() >= static_cast<int64_t>(node.value().size()) + (int64_t{1} << 20))
      node.fail("entry '" + it.key() + "' has id " + it.value().dump() + ", far beyond the vocabulary's " +
                std::to_string(node.value().size()) + " entries");
    vocab.emplace(it.key(), static_cast<int32_t>(it.value().get<int64_t>()));
  }
  return vocab;
}

// "a b" (older files) or ["a", "b"].
Merges read_merges(const JsonNode& node) {
  Merges merges;
  const size_t n = node.size();
  merges.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const json& m = node.value()[i];
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        node[i].fail("must be two tokens separated by one space, got " + node[i].shown());
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      node[i].fail("must be \"a b\" or [\"a\", \"b\"], got " + node[i].shown());
    }
  }
  return merges;
}

std::optional<std::string> optional_string(const JsonNode& node, const std::string& key) {
  if (!node.has(key)) return std::nullopt;
  return node.at(key).str();
}

// model.vocab: read apart by read_tokenizer_json_parts, or from the tree.
Vocab model_vocab(const JsonNode& node, TokenizerJsonParts& parts) {
  const JsonNode vocab_node = node.at("vocab");
  if (parts.vocab) return std::move(*parts.vocab);
  return read_vocab(vocab_node);
}

std::unique_ptr<Model> read_model(const JsonNode& node, TokenizerJsonParts& parts) {
  const JsonNode type_node = node.at("type");
  const std::string type = type_node.str();
  if (type == "BPE") {
    node.expect_only({"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                      "byte_fallback", "ignore_merges", "vocab", "merges"});
    if (node.has("dropout")) {
      const JsonNode dropout = node.at("dropout");
      if (!dropout.value().is_number() || dropout.value().get<double>() != 0.0)
        dropout.fail("BPE dropout " + dropout.shown() + " is not supported (only null)");
    }
    BpeOptions options;
    options.unk_token = optional_string(node, "unk_token");
    options.continuing_subword_prefix = node.str_or("continuing_subword_prefix", "");
    options.end_of_word_suffix = node.str_or("end_of_word_suffix", "");
    options.fuse_unk = node.bool_or("fuse_unk", false);
    options.byte_fallback = node.bool_or("byte_fallback", false);
    options.ignore_merges = node.bool_or("ignore_merges", false);
    Vocab vocab = model_vocab(node, parts);
    const JsonNode merges_node = node.at("merges");
    const Merges merges = parts.merges ? std::move(*parts.merges) : read_merges(merges_node);
    try {
      return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(options));
    } catch (const Error& e) {
      node.fail(e.what());
    }
  }
  if (type == "WordLevel") {
    node.expect_only({"type", "vocab", "unk_token"});
    Vocab vocab = model_vocab(node, parts);
    std::optional<int32_t> unk_id;
    if (auto unk = optional_string(node, "unk_token")) {
      auto it = vocab.find(*unk);
      if (it != vocab.end()) unk_id = it->second;
    }
    return std::make_unique<WordLevelModel>(std::move(vocab), unk_id);
  }
  if (type == "WordPiece") {
    node.expect_only({"type", "unk_token", "continuing_subword_prefix", "max_input_chars_per_word", "vocab"});
    Vocab vocab = model_vocab(node, parts);
    const JsonNode unk = node.at("unk_token");
    auto it = vocab.find(unk.str());
    if (it == vocab.end()) unk.fail("unk_token " + unk.shown() + " is not in the vocabulary");
    const int32_t unk_id = it->second;
    const int64_t max_chars = node.has("max_input_chars_per_word") ? node.at("max_input_chars_per_word").integer() : 100;
    if (max_chars < 0) node.at("max_input_chars_per_word").fail("must not be negative");
    return std::make_unique<WordPieceModel>(std::move(vocab), unk_id, node.str_or("continuing_subword_prefix", "##"),
                                            static_cast<size_t>(max_chars));
  }
  unknown_type(type_node, "model", "BPE, WordLevel, WordPiece");
}

// A post-processor's [token, id] pair (BertProcessing's cls and sep).
TemplatePostProcessor::Item special_item(const JsonNode& node) {
  if (node.size() != 2) node.fail("must be [token, id], got " + node.shown());
  return {false, 0, {static_cast<int32_t>(node[1].integer())}};
}

std::vector<TemplatePostProcessor::Item> read_template(const JsonNode& list, const JsonNode& specials) {
  std::vector<TemplatePostProcessor::Item> items;
  for (size_t i = 0; i < list.size(); ++i) {
    const JsonNode item = list[i];
    if (item.has("Sequence")) {
      const JsonNode id = item.at("Sequence").at("id");
      const std::string which = id.str();
      if (which != "A" && which != "B") id.fail("must be \"A\" or \"B\", got " + id.shown());
      items.push_back({true, which == "A" ? 0 : 1, {}});
    } else if (item.has("SpecialToken")) {
      const JsonNode id = item.at("SpecialToken").at("id");
      const std::string name = id.str();
      if (!specials.has(name)) id.fail("names special token " + id.shown() + ", which special_tokens does not define");
      const JsonNode ids = specials.at(name).at("ids");
      TemplatePostProcessor::Item special{false, 0, {}};
      for (size_t k = 0; k < ids.size(); ++k) special.special_ids.push_back(static_cast<int32_t>(ids[k].integer()));
      items.push_back(std::move(special));
    } else {
      item.fail("must be {\"Sequence\": ...} or {\"SpecialToken\": ...}, got " + item.shown());
    }
  }
  return items;
}

std::unique_ptr<PostProcessor> read_post_processor(const JsonNode& node) {
  const JsonNode type_node = node.at("type");
  const std::string type = type_node.str();
  if (type == "ByteLevel") {
    node.expect_only({"type", "add_prefix_space", "trim_offsets", "use_regex"});  // offsets only: ids pass unchanged
    return std::make_unique<IdentityPostProcessor>();
  }
  if (type == "TemplateProcessing") {
    node.expect_only({"type", "single", "pair", "special_tokens"});
    const JsonNode specials = node.at("special_tokens");
    return std::make_unique<TemplatePostProcessor>(read_template(node.at("single"), specials),
                                                   read_template(node.at("pair"), specials));
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    if (type == "BertProcessing") node.expect_only({"type", "sep", "cls"});
    else node.expect_only({"type", "sep", "cls", "trim_offsets", "add_prefix_space"});
    using Item = TemplatePostProcessor::Item;
    const Item cls = special_item(node.at("cls")), sep = special_item(node.at("sep"));
    const Item a{true, 0, {}}, b{true, 1, {}};
    std::vector<Item> single{cls, a, sep};
    std::vector<Item> pair = type == "BertProcessing" ? std::vector<Item>{cls, a, sep, b, sep}
                                                      : std::vector<Item>{cls, a, sep, sep, b, sep};
    return std::make_unique<TemplatePostProcessor>(std::move(single), std::move(pair));
  }
  if (type == "Sequence") {
    node.expect_only({"type", "processors"});
    const JsonNode list = node.at("processors");
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (size_t i = 0; i < list.size(); ++i) steps.push_back(read_post_processor(list[i]));
    return std::make_unique<SequencePostProcessor>(std::move(steps));
  }
  unknown_type(type_node, "post-processor", "ByteLevel, TemplateProcessing, BertProcessing, RobertaProcessing, Sequence");
}

std::unique_ptr<Decoder> read_decoder(const JsonNode& node) {
  const JsonNode type_node = node.at("type");
  const std::string type = type_node.str();
  if (type == "ByteLevel") node.expect_only({"type", "add_prefix_space", "trim_offsets", "use_regex"});
  if (type == "ByteFallback" || type == "Fuse") node.expect_only({"type"});
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Replace") {
    node.expect_only({"type", "pattern", "content"});
    Pattern p = read_pattern(node.at("pattern"), false);
    const std::string content = node.at("content").str();
    if (p.regex) return std::make_unique<ReplaceDecoder>(std::move(p.regex), content);
    return std::make_unique<ReplaceDecoder>(p.literal, content);
  }
  if (type == "Strip") {
    node.expect_only({"type", "content", "start", "stop"});
    const JsonNode start = node.at("start"), stop = node.at("stop");
    if (start.integer() < 0 || stop.integer() < 0) node.fail("start and stop must not be negative");
    return std::make_unique<StripDecoder>(node.at("content").str(), static_cast<size_t>(start.integer()),
                                          static_cast<size_t>(stop.integer()));
  }
  if (type == "Metaspace") {
    node.expect_only({"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
    return std::make_unique<MetaspaceDecoder>(node.str_or("replacement", "\xe2\x96\x81"),
                                              read_prepend_scheme(node) != PrependScheme::Never);
  }
  if (type == "WordPiece") {
    node.expect_only({"type", "prefix", "cleanup"});
    return std::make_unique<WordPieceDecoder>(node.str_or("prefix", "##"), node.bool_or("cleanup", true));
  }
  if (type == "Sequence") {
    node.expect_only({"type", "decoders"});
    const JsonNode list = node.at("decoders");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < list.size(); ++i) steps.push_back(read_decoder(list[i]));
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  unknown_type(type_node, "decoder", "ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace, WordPiece, Sequence");
}

// Ids as the reference assigns them when it loads the file (the listed ids are not used): a token
// the model has keeps the model's id, others take the next id after the model's vocabulary and the
// added tokens so far, in the order listed. A repeated content is added once.
void read_added_tokens(const JsonNode& list, Tokenizer::Impl& impl) {
  const auto model_size = static_cast<int64_t>(impl.model->vocab_size());
  int64_t max_added = -1;
  for (size_t i = 0; i < list.size(); ++i) {
    const JsonNode t = list[i];
    t.expect_only({"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
    AddedToken tok;
    tok.content = t.at("content").str();
    t.at("id").integer();  // checked for form, not used (see above)
    tok.special = t.bool_or("special", false);
    tok.single_word = t.bool_or("single_word", false);
    tok.lstrip = t.bool_or("lstrip", false);
    tok.rstrip = t.bool_or("rstrip", false);
    tok.normalized = t.bool_or("normalized", !tok.special);
    if (tok.content.empty()) t.at("content").fail("an added token must not be empty");
    if (impl.added_by_content.count(tok.content)) continue;
    if (auto model_id = impl.model->token_to_id(tok.content)) {
      tok.id = *model_id;
    } else {
      tok.id = static_cast<int32_t>(max_added < 0 ? model_size
                                    : max_added >= model_size || model_size == 0 ? max_added + 1
                                                                                 : model_size);
    }
    max_added = std::max(max_added, static_cast<int64_t>(tok.id));
    tok.token_text = tok.content;
    if (tok.normalized && impl.normalizer) impl.normalizer->normalize(tok.token_text);
    impl.added_by_content[tok.content] = tok.id;
    impl.added_tokens.push_back(std::move(tok));
  }
  std::vector<std::string> raw_patterns, normalized_patterns;
  for (size_t i = 0; i < impl.added_tokens.size(); ++i) {
    const AddedToken& tok = impl.added_tokens[i];
    impl.added_by_id[tok.id] = i;
    raw_patterns.push_back(tok.normalized ? std::string() : tok.content);
    normalized_patterns.push_back(tok.normalized ? tok.token_text : std::string());
  }
  impl.raw_matcher = std::make_unique<AddedTokenMatcher>(impl.added_tokens, raw_patterns);
  impl.normalized_matcher = std::make_unique<AddedTokenMatcher>(impl.added_tokens, normalized_patterns);
}

}  // namespace

Tokenizer Tokenizer::from_json(const std::string& json_text, const std::string& source) {
  std::optional<TokenizerJsonParts> parts;
  try {
    parts = read_tokenizer_json_parts(json_text);
    if (!parts) {  // large parts in an irregular form: the tree's readers say what is wrong, if anything
      parts.emplace();
      parts->rest = json::parse(json_text);
    }
  } catch (const json::exception& e) {
    HF_FAIL(source, ": not valid JSON: ", e.what());
  }
  const json& doc = parts->rest;
  const JsonNode root(doc, "", source);
  if (!doc.is_object()) root.fail("tokenizer.json must be a JSON object");
  root.expect_only({"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
                    "decoder", "model"});
  const JsonNode version = root.at("version");
  if (version.str() != "1.0") version.fail("unsupported version " + version.shown() + " (supported: \"1.0\")");
  for (const char* key : {"truncation", "padding"})
    if (root.has(key)) root.at(key).fail("is not supported (only null), got " + root.at(key).shown());

  auto impl = std::make_unique<Impl>();
  if (root.has("normalizer")) impl->normalizer = read_normalizer(root.at("normalizer"));
  if (root.has("pre_tokenizer")) impl->pre_tokenizer = read_pre_tokenizer(root.at("pre_tokenizer"));
  impl->model = read_model(root.at("model"), *parts);
  if (root.has("post_processor")) impl->post_processor = read_post_processor(root.at("post_processor"));
  if (root.has("decoder")) impl->decoder = read_decoder(root.at("decoder"));
  if (root.has("added_tokens")) {
    read_added_tokens(root.at("added_tokens"), *impl);
  } else {
    impl->raw_matcher = std::make_unique<AddedTokenMatcher>(impl->added_tokens, std::vector<std::string>{});
    impl->normalized_matcher = std::make_unique<AddedTokenMatcher>(impl->added_tokens, std::vector<std::string>{});
  }
  return TokenizerBuilder::build(std::move(impl));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HF_CHECK(in.good(), path, ": cannot open tokenizer file");
  // Straight into one string of the file's size: a string stream copied 10 MB files twice more.
  std::string text;
  std::error_code size_error;
  if (const auto size = std::filesystem::file_size(path, size_error); !size_error) text.reserve(size);
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) text.append(chunk, static_cast<size_t>(in.gcount()));
  HF_CHECK(!in.bad(), path, ": cannot read tokenizer file");
  return from_json(text, path);
}

}  // namespace hybridflow::text
