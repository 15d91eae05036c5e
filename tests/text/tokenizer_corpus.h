// Text that exercises a tokenizer: many scripts, emoji sequences, combining marks, digits,
// whitespace of every kind, code, contractions, special-token text inside prose, and one long input.
#pragma once

#include <random>
#include <string>
#include <vector>

namespace hybridflow::testing {

inline std::vector<std::string> tokenizer_corpus() {
  std::vector<std::string> corpus = {
      "",
      " ",
      "Hello, world!",
      "Hello world",
      " Hello  world ",
      "The quick brown fox jumps over the lazy dog.",
      "I'm sure they'll say it's fine; we've done what you'd do, haven't we? THEY'RE HERE. I'M",
      "Café, naïve, façade, Zürich, São Paulo, Ångström, œuvre, ß, İstanbul",
      "Cafe\xcc\x81 vs Caf\xc3\xa9 (decomposed and composed e-acute), n\xcc\x83, a\xcc\x8a\xcc\x81" " x",
      "Привет, мир! Съешь же ещё этих мягких французских булок.",
      "Γειά σου κόσμε· ΣΊΣΥΦΟΣ",
      "مرحبا بالعالم، كيف حالك؟ ١٢٣٤",
      "שלום עולם! עִבְרִית",
      "नमस्ते दुनिया, हिन्दी में लिखा गया पाठ। १२३",
      "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
      "你好，世界！这是一个测试。中文没有空格",
      "日本語のテキスト、ひらがなとカタカナ。",
      "안녕하세요 세계! 한국어 텍스트입니다.",
      "Emoji: 😀 👍🏽 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 ❤️ ✋🏿",
      "👩🏾‍🚀👨🏻‍🔬🧑‍🤝‍🧑",
      "1234567890 3.14159 1,000,000 2024-06-01 0x1F 1e-9 +42 -7 12345678901234567890",
      "spaces:  two   three    four     five",
      "tabs:\tone\t\ttwo\t\t\tthree",
      "newlines:\none\n\ntwo\n\n\nthree\n",
      "windows\r\nline\r\nendings\r\n\r\n",
      "nbsp:\xc2\xa0here\xc2\xa0\xc2\xa0" "and\xe2\x80\x83" "em\xe3\x80\x80" "ideographic",
      "   leading and trailing   ",
      "\n\n\n",
      "\t \n \t",
      "def f(x):\n    return x ** 2  # square\n\nclass A:\n    pass\n",
      "for (int i = 0; i < n; ++i) { sum += a[i]; }\n",
      "std::vector<int> v{1, 2, 3}; auto it = v.begin(); // C++",
      "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
      "{\"key\": [1, 2, {\"nested\": null}], \"b\": true}",
      "SELECT * FROM users WHERE id = 42;",
      "https://example.com/path?query=1&b=2#frag user@mail.org",
      "<|begin_of_text|>Hello<|eot_id|>",
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>",
      "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
      "<|endoftext|>",
      "text<|endoftext|>more text",
      "<s>hello</s> <unk> <s> spaced </s>",
      "<think>\nreasoning\n</think>\n\nanswer",
      "<|im_start|><|im_end|><|im_start|>",
      "<|endoftext",
      "Mixed: hello世界123abc!!!???...",
      "a", "ab", "abc", "!!!", "...", "'s", "'", "''", "'re'", "'S 'T 'Re 'VE 'm 'LL 'd",
      "UPPER lower MiXeD CamelCase snake_case kebab-case",
      "\xe2\x80\x8b zero\xe2\x80\x8b" "width\xe2\x80\x8d joiner",
      "ﬁ ﬂ ① ² ½ ｆｕｌｌｗｉｄｔｈ Ⅻ ㎏ ™",
      "Ǆ ǅ ǆ Å Ω K",
      "a\xcc\x81\xcc\x82\xcc\x83\xcc\x84 stacked marks",
      "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙 𓀀 𐍈 ancient",
      "▁ already has the metaspace ▁▁ char",
      "Ġ ĉ Ċ byte-level look-alikes",
      "tab\there and\x01" "control\x7f chars\x1b[0m",
  };
  // One long input (over 10,000 characters) mixing the above, to exercise long words and caches.
  std::string long_text;
  size_t i = 0;
  while (long_text.size() < 24000) {
    long_text += corpus[(i * 7) % corpus.size()] + (i % 5 == 0 ? "\n" : " ");
    ++i;
  }
  corpus.push_back(long_text);
  // A long run without spaces (one huge pre-token for most tokenizers).
  std::string run;
  for (int k = 0; k < 1000; ++k) run += "abcé漢😀";
  corpus.push_back(run);
  corpus.push_back(std::string(3000, 'a') + "1234567890" + std::string(2000, '!'));
  corpus.push_back(std::string(5000, ' ') + "x" + std::string(3000, '\n'));
  return corpus;
}

// Random concatenations of fragments chosen to meet at awkward places: marks after spaces, digits
// beside letters, contractions in any case, whitespace of every kind before letters or at the end,
// special-token text and its pieces, byte-level and SentencePiece look-alike characters.
inline std::vector<std::string> random_tokenizer_texts(size_t count, unsigned seed) {
  static const char* const kFragments[] = {
      "a", "Hello", "world", "the", "x", "\xc3\xa9", "e\xcc\x81", "\xcc\x81", " ", "  ", "   ", "\t", "\n", "\n\n",
      "\r\n", "\r", "\xc2\xa0", "\xe2\x80\x83", "\xe3\x80\x80", "1", "23", "456", "7890", "'s", "'S", "'ll", "'LL",
      "'", "!", "?", "...", ",", "-", "_", "(", ")", "{", "}", "#", "$", "<|eot_id|>", "<|im_start|>", "<|im_end|>",
      "<|endoftext|>", "<|begin_of_text|>", "<s>", "</s>", "<unk>", "<|", "|>", "<", ">", "\xe4\xb8\x96",
      "\xe7\x95\x8c", "\xf0\x9f\x98\x80", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", "\xe2\x80\x8d", "\xd8\xa7",
      "\xd8\xa8", "\xd0\xb6", "\xce\xa9", "\xe0\xb8\x81", "\xed\x95\x9c", "\xe0\xa4\xa8\xe0\xa4\xae",
      "<0x41>", "\xe2\x96\x81", "\xc4\xa0", "\xd9\x80", "\xef\xac\x81", "\xe2\x91\xa0", "\xf0\x9d\x94\x98",
      "\x01", "\x7f", "\xc2\x85", "\xe2\x80\xa8", "I'M", "don't", "CamelCase", "snake_case", "3.14", "1,000"};
  constexpr size_t kCount = sizeof(kFragments) / sizeof(kFragments[0]);
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) {
    std::string s;
    const size_t n = 1 + rng() % 24;
    for (size_t k = 0; k < n; ++k) s += kFragments[rng() % kCount];
    out.push_back(s);
  }
  return out;
}

}  // namespace hybridflow::testing
