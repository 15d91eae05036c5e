// Which CUDA graphs the decode step uses (engine/decode_graphs.h): a graph replays fixed shapes, so each step
// is padded up to a bucket of rows (the running sequences) and of KV span (the positions attended, a whole
// number of blocks). Buckets grow by a quarter of an octave (at most a quarter of a bucket is padding past small
// sizes). A step replays its own bucket's graph, or else a captured graph up to reuse_factor times larger in
// rows and span, and only when neither exists is a graph captured (a warm-up step, the capture and the
// instantiation, with the device drained before each: several steps' time); with span_headroom the captured
// span leaves room for the sequences to grow. So a rollout whose batch shrinks while its sequences grow
// captures a few graphs, not one per bucket it passes through. Pure bookkeeping: tested on the CPU.
#pragma once

#include <compare>
#include <cstdint>
#include <set>
#include <vector>

namespace hybridflow {

struct DecodeGraphBucket {
  int64_t rows = 0;  // the batch padded up: padding rows decode a pad token at length 0, their output unused
  int64_t span = 0;  // KV positions attended: a multiple of the block size, past each row's length masked
  auto operator<=>(const DecodeGraphBucket&) const = default;
};

// A decode step padded to its bucket: what the graph's static inputs hold.
struct PaddedDecodeStep {
  std::vector<int64_t> tokens;   // [bucket rows]: the rows' input tokens, then pad tokens
  std::vector<int64_t> lengths;  // [bucket rows]: the rows' cached positions, then 0
  // [bucket rows x span / block size], row-major: each row's table cut to the span's blocks, then pad_block
  // (a block no sequence owns: padding rows write their keys there, and real rows read it only masked).
  std::vector<int64_t> tables;
};

// n itself up to `exact`, then n rounded up to a step of a quarter of the largest power of two below n (never
// less than `step`, and a multiple of it): 960 positions in blocks of 16 -> 1024, 1040 -> 1280; 65 rows -> 80.
int64_t quarter_octave_bucket(int64_t n, int64_t step, int64_t exact);

class DecodeGraphPlan {
 public:
  struct Options {
    int64_t block_size = 16;  // positions per KV block
    int64_t max_rows = 512;   // larger batches run eagerly
    int64_t max_span = 0;     // the longest sequence a step can hold (a span bucket is cut to it, in blocks)
    int64_t max_graphs = 64;  // captured graphs at most (each holds its own activations); later buckets run eagerly
    // A step replays a captured graph of at most this many times its own bucket's rows and span rather than
    // capturing its own (1: its own bucket only). The padding rows decode a pad token at length 0, and a longer
    // span only masks more positions: at the few rows of a rollout's tail, where a capture costs most against a
    // step, a step of twice the rows costs about as much (the weights' reads dominate it).
    int64_t reuse_factor = 2;
    // A graph is captured with this many times its bucket's span (cut to max_span), so that the steps after it,
    // whose sequences are longer, still fit it. Worth it where a longer span costs only masked positions that
    // are never read (the fused kernels read each row's own positions); 1 elsewhere, where a step attends its
    // whole span.
    int64_t span_headroom = 1;
  };
  enum class Action { kEager, kCapture, kReplay };
  struct Decision {
    Action action = Action::kEager;
    DecodeGraphBucket bucket;
  };

  // Throws naming the option when a size is not positive.
  explicit DecodeGraphPlan(Options options);

  // The bucket of `rows` rows of which the longest attends `longest` positions (its length + 1), or
  // rows = 0 when the step runs eagerly whatever was captured (more rows than max_rows).
  DecodeGraphBucket bucket(int64_t rows, int64_t longest) const;
  // Replay the bucket's graph when captured, else the smallest captured graph that holds the step within
  // reuse_factor; capture the bucket (with span_headroom) when there is room for another graph; else eager.
  Decision decide(int64_t rows, int64_t longest) const;
  void mark_captured(const DecodeGraphBucket& bucket) { captured_.insert(bucket); }
  int64_t graphs() const { return static_cast<int64_t>(captured_.size()); }
  const Options& options() const { return options_; }

  // The step's inputs padded to `bucket` (which must hold them: rows and every length + 1 within it).
  PaddedDecodeStep pad(const DecodeGraphBucket& bucket, const std::vector<int64_t>& tokens,
                       const std::vector<std::vector<int64_t>>& tables, const std::vector<int64_t>& lengths,
                       int64_t pad_block, int64_t pad_token) const;
  // pad()'s tokens, lengths and tables one after the other in `out` [bucket rows x (2 + span / block size)],
  // the graph's static input as uploaded, written in one pass with nothing allocated (a decode step's host
  // work): tables[r] points at row r's table; `tokens` may be null (every token pad_token: the caller copies
  // its tokens on the device).
  void write_padded(const DecodeGraphBucket& bucket, const int64_t* tokens,
                    const std::vector<const std::vector<int64_t>*>& tables, const std::vector<int64_t>& lengths,
                    int64_t pad_block, int64_t pad_token, int64_t* out) const;

 private:
  Options options_;
  std::set<DecodeGraphBucket> captured_;
};

}  // namespace hybridflow
