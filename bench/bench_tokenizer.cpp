// Encode throughput of hybridflow's text::Tokenizer against the Python `tokenizers` library, on the
// same documents in the same run, for each published tokenizer found. Both sides encode one
// document at a time on one thread (the reference with RAYON_NUM_THREADS=1), without special tokens.
// The corpus: this repository's docs and sources (English prose and code) and multilingual text.
// The first pass fills each side's word cache ("cold"); the best of the following passes is "warm".
// Before encoding, each tokenizer.json is loaded `loads` times (read, parse, build the model): the
// best and the median load time are printed; with --load-only=1 nothing else is run.
//   bench_tokenizer [--data=DIR] [--passes=3] [--loads=5] [--load-only=0] [--python=PATH]
// DIR holds <name>/tokenizer.json (default: where the text tests find them, see tests/support/testdata_dir.h).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.h"
#include "hybridflow/text/tokenizer.h"
#include "support/testdata_dir.h"
#include "text/tokenizer_corpus.h"

using namespace hybridflow;
namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

std::vector<std::string> bench_corpus() {
  std::vector<std::string> docs;
  std::vector<fs::path> files;
  for (const char* dir : {"docs", "src", "include", "apps"}) {
    const fs::path root = fs::path(HF_SOURCE_DIR) / dir;
    if (!fs::is_directory(root)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
      const std::string ext = entry.path().extension().string();
      if (entry.is_regular_file() && (ext == ".md" || ext == ".cpp" || ext == ".h")) files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) docs.push_back(read_text(f));
  // Multilingual text, emoji and whitespace runs, several times over (short documents).
  for (int rep = 0; rep < 20; ++rep)
    for (const std::string& s : testing::tokenizer_corpus())
      if (!s.empty() && s.size() < 2000) docs.push_back(s);
  return docs;
}

// Best and median seconds of Tokenizer::from_file(path) over `loads` loads.
std::pair<double, double> load_seconds(const std::string& path, int loads) {
  std::vector<double> times;
  for (int i = 0; i < loads; ++i) {
    const double start = bench::now_seconds();
    const text::Tokenizer tok = text::Tokenizer::from_file(path);
    times.push_back(bench::now_seconds() - start);
  }
  std::sort(times.begin(), times.end());
  return {times.front(), times[times.size() / 2]};
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

int main(int argc, char** argv) {
  const std::string data = bench::arg(argc, argv, "data", testing::tokenizer_data_dir());
  const int passes = static_cast<int>(std::max(2LL, bench::arg_int(argc, argv, "passes", 3)));
  const std::string python = bench::arg(argc, argv, "python", HF_SOURCE_DIR "/.venv/bin/python");
  const int loads = static_cast<int>(std::max(1LL, bench::arg_int(argc, argv, "loads", 5)));
  const bool load_only = bench::arg_int(argc, argv, "load-only", 0) != 0;

  for (const char* name : {"gpt2", "llama3", "qwen3", "spm-bpe-32k"}) {
    const std::string path = data + "/" + name + "/tokenizer.json";
    if (!fs::exists(path)) continue;
    const auto [best, median] = load_seconds(path, loads);
    std::printf("load %-12s %6.1f MB  best %7.1f ms  median %7.1f ms  (%d loads)\n", name,
                static_cast<double>(fs::file_size(path)) / 1e6, best * 1e3, median * 1e3, loads);
  }
  if (load_only) return 0;

  const std::vector<std::string> docs = bench_corpus();
  size_t bytes = 0;
  for (const std::string& d : docs) bytes += d.size();
  const fs::path corpus_file = fs::temp_directory_path() / ("bench_tokenizer_corpus_" + std::to_string(::getpid()) + ".json");
  std::ofstream(corpus_file) << nlohmann::json(docs).dump();
  std::printf("corpus: %zu documents, %.2f MB (repo docs and sources, multilingual text); one thread each side,\n"
              "one document per encode call, no special tokens; cold = first pass, warm = best of %d more\n",
              docs.size(), static_cast<double>(bytes) / 1e6, passes - 1);
  std::printf("%-12s %-11s %10s %12s %10s %12s %8s %8s\n", "tokenizer", "pass", "hf MB/s", "hf tok/s", "py MB/s",
              "py tok/s", "ratio", "same");

  for (const char* name : {"gpt2", "llama3", "qwen3", "spm-bpe-32k"}) {
    const std::string path = data + "/" + name + "/tokenizer.json";
    if (!fs::exists(path)) {
      std::printf("%-12s not found: %s\n", name, path.c_str());
      continue;
    }
    text::Tokenizer tok = text::Tokenizer::from_file(path);
    // The ids' hash, as reference_encode.py computes it: both sides must give the very same ids.
    uint64_t our_hash = 0xCBF29CE484222325ull;
    for (const std::string& d : docs)
      for (int32_t id : tok.encode(d, false))
        for (int k = 0; k < 4; ++k) our_hash = (our_hash ^ ((static_cast<uint32_t>(id) >> (8 * k)) & 0xff)) * 0x100000001B3ull;
    tok = text::Tokenizer::from_file(path);  // a fresh word cache for the timed passes
    std::vector<double> ours;
    size_t our_tokens = 0;
    for (int p = 0; p < passes; ++p) {
      const double start = bench::now_seconds();
      size_t n = 0;
      for (const std::string& d : docs) n += tok.encode(d, false).size();
      ours.push_back(bench::now_seconds() - start);
      our_tokens = n;
    }
    const std::string cmd = "RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false " + shell_quote(python) + " " +
                            shell_quote(HF_SOURCE_DIR "/bench/tokenizer/reference_encode.py") + " " + shell_quote(path) +
                            " " + shell_quote(corpus_file.string()) + " " + std::to_string(passes);
    std::string out;
    if (FILE* pipe = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      size_t k;
      while ((k = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, k);
      ::pclose(pipe);
    }
    nlohmann::json ref;
    try {
      ref = nlohmann::json::parse(out);
    } catch (const nlohmann::json::exception&) {
      std::printf("%-12s the Python reference failed: %s\n", name, cmd.c_str());
      continue;
    }
    const auto theirs = ref["passes"].get<std::vector<double>>();
    const size_t their_tokens = ref["tokens"].get<size_t>();
    const bool same_ids = ref["fnv"].get<uint64_t>() == our_hash && their_tokens == our_tokens;
    const double mb = static_cast<double>(bytes) / 1e6;
    auto row = [&](const char* label, double ours_s, double theirs_s) {
      std::printf("%-12s %-11s %10.2f %12.0f %10.2f %12.0f %7.2fx %8s\n", name, label, mb / ours_s,
                  static_cast<double>(our_tokens) / ours_s, mb / theirs_s, static_cast<double>(their_tokens) / theirs_s,
                  theirs_s / ours_s, same_ids ? "yes" : "NO");
    };
    row("cold", ours[0], theirs[0]);
    row("warm", *std::min_element(ours.begin() + 1, ours.end()), *std::min_element(theirs.begin() + 1, theirs.end()));
  }
  fs::remove(corpus_file);
  std::printf("ratio = hybridflow speed / tokenizers (Python) speed; same = identical ids (count and hash)\n");
  return 0;
}
