// Reads a tokenizer.json in one pass without a JSON tree of its two large parts: model.vocab (every
// token and its id, 150k entries in recent files) and model.merges go straight into the tables the
// model is built from, while the rest (components and options, a few kilobytes) stays a JSON tree
// for the component readers. A tree of the whole file cost most of a tokenizer's load time.
//
// Only the regular form of the large parts is read apart: a vocab of distinct tokens with distinct
// ids in 0..INT32_MAX, and merges of "a b" strings or ["a", "b"] pairs. Anything else (a duplicate
// key or id, a value of another type, a second model or vocab) makes the reader give up, and the
// caller reads the file as one tree, whose readers name the exact entry and what was wrong with it.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "text/model.h"

namespace hybridflow::text {

using Merges = std::vector<std::pair<std::string, std::string>>;

struct TokenizerJsonParts {
  // The document; model.vocab is {} and model.merges is [] in it where they were read apart.
  nlohmann::json rest;
  std::optional<Vocab> vocab;    // model.vocab, when read apart
  std::optional<Merges> merges;  // model.merges, when read apart
};

// Null when the large parts are not in the regular form (see above). Text that is not JSON throws
// the nlohmann::json::parse_error that json::parse gives for it.
std::optional<TokenizerJsonParts> read_tokenizer_json_parts(const std::string& text);

}  // namespace hybridflow::text
