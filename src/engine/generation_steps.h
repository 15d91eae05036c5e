// What the two generation paths (generation_static.cpp, continuous_batching.cpp) share: the prompts as
// the output's left-padded tensors, token choice with per-sequence draws, and the hand-off between
// pipeline stages. Internal to the engine layer; the interface is engine/generation.h.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "hybridflow/core/device_upload.h"
#include "hybridflow/engine/decode_graphs.h"
#include "hybridflow/engine/generation.h"

namespace hybridflow::generation {

// The output's prompt tensors: row q = i * n + j holds prompt i left-padded to the longest prompt.
struct PromptBatch {
  torch::Tensor ids;    // [B*n, P] int64 on the model's device, pad_token_id on the left
  torch::Tensor mask;   // [B*n, P] int64 (1 real, 0 pad)
  int64_t longest = 0;  // P
};
PromptBatch pad_prompts(const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& cfg,
                        torch::Device device);

// A pipeline stage's part of one forward: a stage after the first receives its input from the stage
// before, one before the last sends its output on, and the last stage's choice of tokens reaches every
// stage. Without stages every call is a no-op (the model is whole).
class StageLink {
 public:
  StageLink(CausalLM& model, Communicator* stages);
  bool samples() const { return !stage_->enabled() || stage_->last(); }
  // Before a forward of input_ids [rows, seq].
  void receive(int64_t rows, int64_t seq);
  // After it, with what this stage computed.
  void send(const torch::Tensor& hidden);
  // The last stage's tokens [rows] int64 and log-probs [rows] float32, on every stage.
  void share(torch::Tensor& tokens, torch::Tensor& log_probs, int64_t rows);

 private:
  CausalLM& model_;
  Communicator* stages_;
  const PipelineStage* stage_;
};

// The uniforms of `steps` consecutive draws of each row, [steps, rows] float64 on `device`: row r's draw k is
// sampling_uniform(cfg.seed, sequences[r], first_steps[r] + k). Computed on the host, where every input is
// known without reading the device back, and uploaded once.
torch::Tensor sampling_uniforms(const GenerationConfig& cfg, const std::vector<int64_t>& sequences,
                                const std::vector<int64_t>& first_steps, int64_t steps, torch::Device device);
// The same with a seed per row (streamed prompts carry their own: StreamedPrompt).
torch::Tensor sampling_uniforms(const std::vector<uint64_t>& seeds, const std::vector<int64_t>& sequences,
                                const std::vector<int64_t>& first_steps, int64_t steps, torch::Device device);

// Tokens drawn on the logits' device with nothing read back: tokens [rows] int64, their log-probs [rows]
// float32, and no_mass [rows] bool (sampling only; undefined when greedy): rows with no finite sampling
// distribution, whose token means nothing; a caller checks it when it reads the step back.
using TokenDraw = DecodeDraw;
TokenDraw draw_tokens(const torch::Tensor& logits, const GenerationConfig& cfg, const torch::Tensor& uniforms);
// The same from last-position hidden states [rows, hidden] (the model's head, the sampleable vocabulary and
// the batch-invariant log-probs applied); uniforms [rows] float64 (undefined when greedy).
TokenDraw choose_tokens_on_device(CausalLM& model, const torch::Tensor& hidden, const GenerationConfig& cfg,
                                  const torch::Tensor& uniforms);
// Throws naming the first row of no_mass that is set (one read-back); nothing when undefined.
void check_sampleable(const torch::Tensor& no_mass);

// Tokens and log-probs for last-position hidden states [rows, hidden]: row r is token steps[r] of sequence
// sequences[r], drawn with sampling_uniform(cfg.seed, sequences[r], steps[r]). Reads the device back once.
std::pair<torch::Tensor, torch::Tensor> choose_tokens(CausalLM& model, const torch::Tensor& hidden,
                                                      const GenerationConfig& cfg,
                                                      const std::vector<int64_t>& sequences,
                                                      const std::vector<int64_t>& steps);

// The paged pool's size in blocks that cfg fixes: kv_cache_blocks when > 0, else what memory_budget_bytes
// buys (gpu_memory_utilization of it less the weights); 0 when neither is set.
int64_t given_pool_blocks(CausalLM& model, const GenerationConfig& cfg);

// A slab of zeros [sizes] (on the CPU from fresh anonymous pages, zeroed by the kernel when first touched).
torch::Tensor zero_slab(const std::vector<int64_t>& sizes, const torch::TensorOptions& options);

// One prefill forward's inputs for rows whose positions [0, cached[r]) are in the KV cache already and whose
// ids from there on are new: the cached positions come as PagedKVCache::gather lays them (left-padded to the
// longest, `past`), the new ids follow at their own positions, right-padded to `width`. On the CPU.
struct PrefillRows {
  torch::Tensor ids;        // [rows, width], pad_id after a row's new ids
  torch::Tensor mask;       // [rows, past + width]: 1 on each row's cached and new positions
  torch::Tensor positions;  // [rows, width]: cached[r] + t (padding repeats the row's last position)
  int64_t past = 0, width = 0;
  std::vector<int64_t> last;    // per row: its last id's column in the forward's output
  std::vector<int64_t> shifts;  // per row: past - cached[r] (PagedKVCache::write_prefill's shifts)
};
PrefillRows prefill_rows(const std::vector<const std::vector<int64_t>*>& contexts, const std::vector<int64_t>& cached,
                         int64_t pad_id);

// A chunk of decode steps' draws kept on the device and read back at once (GenerationConfig::
// readback_interval): each step's tokens and log-probs, which rows were still running when it drew (a row
// stops at an eos id; its later draws are discarded), the rows ended by the chunk's end, and rows with no
// finite sampling distribution. record() and store() queue device work only; read_back() is the chunk's one
// host synchronisation.
class TokenRing {
 public:
  TokenRing(int64_t rows, int64_t steps, const GenerationConfig& cfg, torch::Device device);
  // Step k's draw (no_mass may be undefined); returns [rows] bool: the rows whose token counts (running
  // before it), and marks the rows it ends. drawing [rows] bool, when given, names the rows that drew at this
  // step; the others' entries are placeholders that never count (a chunk whose rows join at different steps).
  torch::Tensor record(int64_t k, const torch::Tensor& tokens, const torch::Tensor& log_probs,
                       const torch::Tensor& no_mass, const torch::Tensor& drawing = {});
  // Step k's draw for a caller that needs no per-step `live` on the device (every row draws every step):
  // only the draw is copied into the ring (two or three copies, against record()'s eight or so operators),
  // and read_back() works out on the host which tokens count, which rows ended and which had no mass, the
  // same as record() would have. A ring takes either store() or record(), not both.
  void store(int64_t k, const torch::Tensor& tokens, const torch::Tensor& log_probs, const torch::Tensor& no_mass);
  struct Chunk {
    torch::Tensor tokens;     // [steps, rows] int64, CPU
    torch::Tensor log_probs;  // [steps, rows] float32, CPU
    torch::Tensor live;       // [steps, rows] bool, CPU: the token counts
    torch::Tensor ended;      // [rows] bool, CPU: an eos id among the row's counted tokens
  };
  // Throws when a counted draw had no finite sampling distribution.
  Chunk read_back();

 private:
  Chunk read_back_stored(const torch::Tensor& host) const;
  int64_t steps_;
  torch::Device device_;
  std::vector<int64_t> eos_token_ids_;
  enum class Mode { kNone, kRecorded, kStored } mode_ = Mode::kNone;
  // [3 * steps + 2, rows] float64: tokens, log-probs, live (stored: no mass per step), ended, no mass
  torch::Tensor packed_;
  torch::Tensor ended_, no_mass_, eos_ids_;  // record() only, made at its first call
};

// True when a token id ends a sequence.
bool is_eos(const GenerationConfig& cfg, int64_t token);

GenerationOutput generate_static(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                 const GenerationConfig& cfg, Communicator* stages);
GenerationOutput generate_continuous(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                     const GenerationConfig& cfg, Communicator* stages);

}  // namespace hybridflow::generation
