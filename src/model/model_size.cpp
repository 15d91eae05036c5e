// Sizes a config implies, computed without building the model (see model_size.h for why).
#include "hybridflow/model/model_size.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

double d(int64_t v) { return static_cast<double>(v); }

// A "Key:   123 kB" line of a /proc file, in bytes; -1 when absent.
double proc_kb_field(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    double kb = -1;
    fields >> kb;
    return kb < 0 ? -1 : kb * 1024.0;
  }
  return -1;
}

// A cgroup v2 file holding one number or "max"; -1 when absent or unlimited.
double cgroup_number(const std::string& file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    return std::stod(text);
  } catch (const std::exception&) {
    return -1;
  }
}

// This process's cgroup v2 directory ("0::/path" in /proc/self/cgroup); the root when not found.
std::string cgroup_dir() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + (line.size() > 3 && line != "0::/" ? line.substr(3) : "");
  return "/sys/fs/cgroup";
}

std::string number(double v) {
  char buffer[64];
  if (v < 1e15 && v == std::floor(v)) {
    std::snprintf(buffer, sizeof buffer, "%.0f", v);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.3g", v);
  }
  return buffer;
}

}  // namespace

ModelSize model_size(const ModelConfig& c, bool value_head) {
  const double h = d(c.hidden_size), v = d(c.vocab_size), layers = d(c.num_hidden_layers);
  const double head_dim = d(c.head_dim()), q = d(c.num_attention_heads) * head_dim,
               kv = d(c.num_key_value_heads) * head_dim;
  double attention = 2 * h * q + 2 * h * kv;  // q, o, k, v
  if (c.attention_bias) attention += q + 2 * kv;
  if (c.o_proj_bias()) attention += h;
  if (c.qk_norm()) attention += 2 * head_dim;
  ModelSize out;
  const bool lm_head = !value_head && !c.tie_word_embeddings;
  out.embeddings = v * h * (lm_head ? 2 : 1);
  out.attention = layers * attention;
  const double sparse = d(c.num_moe_layers()), dense = layers - sparse;
  out.mlp = dense * 3 * h * d(c.intermediate_size);
  if (sparse > 0) {
    const double expert = 3 * h * d(c.expert_intermediate_size());
    out.mlp += sparse * h * d(c.moe.num_experts);  // routers
    if (c.shared_expert()) out.mlp += sparse * (3 * h * d(c.moe.shared_expert_intermediate_size) + h);
    out.experts = sparse * d(c.moe.num_experts) * expert;
    out.active_experts = sparse * d(c.moe.num_experts_per_tok) * expert;
  }
  out.other = layers * 2 * h + h + (value_head ? h : 0);
  return out;
}

TrainingMemory training_memory(const ModelConfig& c, const TrainingMemoryOptions& o) {
  HF_CHECK(o.weight_bytes == 2 || o.weight_bytes == 4, "training memory: weight bytes must be 2 (bf16 / fp16) or 4 ",
           "(fp32), got ", o.weight_bytes);
  HF_CHECK(o.tp >= 1 && o.pp >= 1 && o.zero >= 1 && o.micro_rows >= 1 && o.sequence >= 1,
           "training memory: tp, pp, zero, micro-batch rows and sequence length must be >= 1");
  const double pb = o.weight_bytes;
  const bool mixed = pb == 2;
  const double shard = model_size(c, o.value_head).parameters() / (d(o.tp) * d(o.pp));
  TrainingMemory out;
  out.weights = shard * pb;
  out.grads = shard * pb + (o.fp32_gradients && mixed ? shard * 4.0 : 0.0);
  if (o.masters_partitioned) {
    out.optimizer = shard * (mixed ? 12.0 : 8.0) / d(o.zero);
    out.masters = mixed ? shard * 4.0 / d(o.zero) : 0.0;
    out.adam = out.optimizer - out.masters;
  } else {
    out.masters = mixed ? shard * 4.0 : 0.0;
    out.adam = shard * 8.0 / d(o.zero);
    out.optimizer = out.masters + out.adam;
  }
  const double rows = d(o.micro_rows), seq = d(o.sequence), tp = d(o.tp);
  out.activations = d(c.num_hidden_layers) * rows * seq * d(c.hidden_size) * 17.0 * pb / tp;
  out.checkpointed_activations =
      d(c.num_hidden_layers) * rows * seq * d(c.hidden_size) * pb / tp + rows * seq * d(c.hidden_size) * 17.0 * pb / tp;
  if (!o.value_head) out.logits = rows * seq * d(c.vocab_size) / tp * 8.0;
  return out;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 6) {
    bytes /= 1024;
    ++unit;
  }
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, bytes < 10 && unit > 0 ? "%.1f %s" : "%.0f %s", bytes, units[unit]);
  return buffer;
}

AvailableMemory available_memory() {
  AvailableMemory out;
  out.bytes = std::numeric_limits<double>::infinity();
  out.source = "no limit found";
  const double mem = proc_kb_field("/proc/meminfo", "MemAvailable");
  if (mem >= 0) {
    const double swap = proc_kb_field("/proc/meminfo", "SwapFree");
    out.bytes = mem + std::max(0.0, swap);
    out.source = "MemAvailable + SwapFree in /proc/meminfo";
  }
  // A container's limit: what is left of memory.max.
  const std::string cgroup = cgroup_dir();
  const double cg_max = cgroup_number(cgroup + "/memory.max");
  if (cg_max >= 0) {
    const double left = cg_max - std::max(0.0, cgroup_number(cgroup + "/memory.current"));
    if (left < out.bytes) {
      out.bytes = std::max(0.0, left);
      out.source = "memory.max - memory.current of cgroup " + cgroup;
    }
  }
  // ulimit -v: the address space left to this process.
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const double left = d(static_cast<int64_t>(as.rlim_cur)) - std::max(0.0, proc_kb_field("/proc/self/status", "VmSize"));
    if (left < out.bytes) {
      out.bytes = std::max(0.0, left);
      out.source = "RLIMIT_AS (ulimit -v) headroom of this process";
    }
  }
  return out;
}

void check_model_fits_memory(const ModelConfig& c, bool value_head, double bytes_per_parameter, double share,
                             const std::string& where) {
  const ModelSize size = model_size(c, value_head);
  const double bytes = size.parameters() * bytes_per_parameter * share;
  const AvailableMemory available = available_memory();
  if (bytes <= available.bytes) return;
  // Name the term that makes it large, with the keys it is the product of.
  struct Term {
    double parameters;
    std::string keys;
  };
  const std::string layers = "num_hidden_layers (" + number(d(c.num_hidden_layers)) + ")";
  const std::string hidden = "hidden_size (" + number(d(c.hidden_size)) + ")";
  std::vector<Term> terms = {
      {size.embeddings, "vocab_size (" + number(d(c.vocab_size)) + ") x " + hidden},
      {size.attention, layers + " x " + hidden + " x num_attention_heads (" + number(d(c.num_attention_heads)) +
                           ") + num_key_value_heads (" + number(d(c.num_key_value_heads)) + ") x head_dim (" +
                           number(d(c.head_dim())) + ")"},
      {size.mlp, layers + " x " + hidden + " x intermediate_size (" + number(d(c.intermediate_size)) + ")"},
      {size.experts, layers + " x " + hidden + " x num_experts (" + number(d(c.moe.num_experts)) + ") x " +
                         "moe_intermediate_size (" + number(d(c.expert_intermediate_size())) + ")"},
      {size.other, layers + " x " + hidden}};
  const Term& largest = *std::max_element(terms.begin(), terms.end(),
                                          [](const Term& a, const Term& b) { return a.parameters < b.parameters; });
  HF_FAIL(where, ": the model has ", number(size.parameters()), " parameters, ",
          share < 1 ? "this process's share of them " : "", human_bytes(bytes), " at ", number(bytes_per_parameter),
          " bytes each, more than the ", human_bytes(available.bytes), " available (", available.source,
          "); most of it (", std::lround(100 * largest.parameters / size.parameters()), "%) from ", largest.keys,
          ". Check those keys of config.json");
}

double expected_weight_count(const ModelConfig& c, bool value_head) {
  double per_layer = 9;  // q k v o, gate up down, two norms
  if (c.attention_bias) per_layer += 3;
  if (c.o_proj_bias()) per_layer += 1;
  if (c.qk_norm()) per_layer += 2;
  const bool lm_head = !value_head && !c.tie_word_embeddings;
  // A sparse layer has a router and 3 weights per expert (and a shared expert with its gate) for the MLP's 3.
  const double sparse_extra = 1 + 3 * d(c.moe.num_experts) + (c.shared_expert() ? 4 : 0) - 3;
  return 2 + (lm_head || value_head ? 1 : 0) + d(c.num_hidden_layers) * per_layer + d(c.num_moe_layers()) * sparse_extra;
}

void for_each_expected_weight(const ModelConfig& c, bool value_head, const WeightVisitor& visit) {
  const int64_t h = c.hidden_size, head_dim = c.head_dim(), q = c.num_attention_heads * head_dim,
                kv = c.num_key_value_heads * head_dim, inter = c.intermediate_size;
  if (!visit("model.embed_tokens.weight", {c.vocab_size, h})) return;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i) + ".";
    const std::string attn = layer + "self_attn.";
    const std::vector<std::pair<std::string, std::vector<int64_t>>> weights = [&] {
      std::vector<std::pair<std::string, std::vector<int64_t>>> w = {
          {layer + "input_layernorm.weight", {h}},
          {layer + "post_attention_layernorm.weight", {h}},
          {attn + "q_proj.weight", {q, h}},
          {attn + "k_proj.weight", {kv, h}},
          {attn + "v_proj.weight", {kv, h}},
          {attn + "o_proj.weight", {h, q}}};
      if (c.moe_layer(i)) {
        const std::string block = layer + c.moe_block_name() + ".";
        const int64_t width = c.expert_intermediate_size();
        w.push_back({block + "gate.weight", {c.moe.num_experts, h}});
        for (int64_t e = 0; e < c.moe.num_experts; ++e) {
          const std::string expert = block + "experts." + std::to_string(e) + ".";
          w.push_back({expert + c.expert_gate_name() + ".weight", {width, h}});
          w.push_back({expert + c.expert_up_name() + ".weight", {width, h}});
          w.push_back({expert + c.expert_down_name() + ".weight", {h, width}});
        }
        if (c.shared_expert()) {
          const int64_t shared = c.moe.shared_expert_intermediate_size;
          w.push_back({block + "shared_expert.gate_proj.weight", {shared, h}});
          w.push_back({block + "shared_expert.up_proj.weight", {shared, h}});
          w.push_back({block + "shared_expert.down_proj.weight", {h, shared}});
          w.push_back({block + "shared_expert_gate.weight", {1, h}});
        }
      } else {
        w.push_back({layer + "mlp.gate_proj.weight", {inter, h}});
        w.push_back({layer + "mlp.up_proj.weight", {inter, h}});
        w.push_back({layer + "mlp.down_proj.weight", {h, inter}});
      }
      if (c.attention_bias) {
        w.push_back({attn + "q_proj.bias", {q}});
        w.push_back({attn + "k_proj.bias", {kv}});
        w.push_back({attn + "v_proj.bias", {kv}});
      }
      if (c.o_proj_bias()) w.push_back({attn + "o_proj.bias", {h}});
      if (c.qk_norm()) {
        w.push_back({attn + "q_norm.weight", {head_dim}});
        w.push_back({attn + "k_norm.weight", {head_dim}});
      }
      return w;
    }();
    for (const auto& [name, shape] : weights)
      if (!visit(name, shape)) return;
  }
  if (!visit("model.norm.weight", {h})) return;
  if (value_head) {
    visit("score.weight", {1, h});
  } else if (!c.tie_word_embeddings) {
    visit("lm_head.weight", {c.vocab_size, h});
  }
}

std::map<std::string, std::vector<int64_t>> expected_weight_shapes(const ModelConfig& c, bool value_head) {
  std::map<std::string, std::vector<int64_t>> out;
  for_each_expected_weight(c, value_head, [&out](const std::string& name, const std::vector<int64_t>& shape) {
    out[name] = shape;
    return true;
  });
  return out;
}

}  // namespace hybridflow
