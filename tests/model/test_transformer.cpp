#include "hybridflow/model/transformer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "hybridflow/core/error.h"
#include "hybridflow/kernels/decode_kernels.h"
#include "hybridflow/kernels/few_rows_linear.h"
#include "support/error_of.h"
#include "support/operator_counter.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

ModelConfig small_config(bool qwen2 = false) {
  return testing::tiny_model_config(
      {.vocab_size = 37, .hidden_size = 32, .intermediate_size = 48, .max_position_embeddings = 64},
      qwen2 ? "qwen2-tiny" : "tiny");
}

std::set<std::string> param_names(const CausalLM& model) {
  std::set<std::string> names;
  for (const auto& item : model->named_parameters()) names.insert(item.key());
  return names;
}

float max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

class TransformerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    torch::manual_seed(7);
  }
};

TEST_F(TransformerTest, OutputShapesForBothHeads) {
  auto config = small_config();
  CausalLM lm(config);
  CausalLM critic(config, HeadKind::kValue);
  auto ids = torch::randint(0, config.vocab_size, {3, 6}, torch::kInt64);
  auto mask = torch::ones({3, 6}, torch::kInt64);
  auto lm_out = lm->forward(ids, mask);
  EXPECT_EQ(lm_out.logits.sizes(), (std::vector<int64_t>{3, 6, config.vocab_size}));
  EXPECT_EQ(lm_out.logits.scalar_type(), torch::kFloat32);
  EXPECT_FALSE(lm_out.values.defined());
  auto v_out = critic->forward(ids, mask);
  EXPECT_EQ(v_out.values.sizes(), (std::vector<int64_t>{3, 6}));
  EXPECT_FALSE(v_out.logits.defined());
  auto names = param_names(critic);
  EXPECT_TRUE(names.count("score.weight"));
  EXPECT_FALSE(names.count("lm_head.weight"));
  EXPECT_EQ(critic->named_parameters()["score.weight"].sizes(), (std::vector<int64_t>{1, config.hidden_size}));
}

TEST_F(TransformerTest, HeadOnSelectedHiddenStatesEqualsForward) {
  auto config = small_config(true);
  CausalLM model(config);
  auto ids = torch::randint(0, config.vocab_size, {2, 6}, torch::kInt64);
  auto mask = torch::ones({2, 6}, torch::kInt64);
  auto full = model->forward(ids, mask).logits;
  auto hidden = model->hidden_states(ids, mask);
  EXPECT_EQ(hidden.sizes(), (std::vector<int64_t>{2, 6, config.hidden_size}));
  auto last = model->apply_head(hidden.select(1, -1)).logits;
  EXPECT_LT(max_diff(last, full.select(1, -1)), 1e-6);
}

TEST_F(TransformerTest, HuggingFaceParameterNames) {
  auto llama = param_names(CausalLM(small_config(false)));
  auto qwen = param_names(CausalLM(small_config(true)));
  for (const char* name :
       {"model.embed_tokens.weight", "model.layers.1.input_layernorm.weight", "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight",
        "model.layers.1.self_attn.o_proj.weight", "model.layers.1.post_attention_layernorm.weight",
        "model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight",
        "model.layers.1.mlp.down_proj.weight", "model.norm.weight"}) {
    EXPECT_TRUE(llama.count(name)) << name;
    EXPECT_TRUE(qwen.count(name)) << name;
  }
  EXPECT_TRUE(llama.count("lm_head.weight"));
  EXPECT_FALSE(qwen.count("lm_head.weight"));  // tied to embed_tokens
  for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
    std::string bias = std::string("model.layers.0.self_attn.") + proj + ".bias";
    EXPECT_TRUE(qwen.count(bias)) << bias;
    EXPECT_FALSE(llama.count(bias)) << bias;
  }
  EXPECT_FALSE(qwen.count("model.layers.0.self_attn.o_proj.bias"));
  EXPECT_FALSE(qwen.count("model.layers.0.mlp.up_proj.bias"));
}

TEST_F(TransformerTest, ParameterCountMatchesConfig) {
  for (const char* preset : {"tiny", "qwen2-tiny", "small"}) {
    auto config = preset_model_config(preset, 50);
    CausalLM model(config);
    int64_t count = 0;
    for (const auto& p : model->parameters()) count += p.numel();
    EXPECT_EQ(count, config.num_parameters()) << preset;
    CausalLM critic(config, HeadKind::kValue);
    int64_t critic_count = 0;
    for (const auto& p : critic->parameters()) critic_count += p.numel();
    const int64_t lm_head = config.tie_word_embeddings ? 0 : config.vocab_size * config.hidden_size;
    EXPECT_EQ(critic_count, config.num_parameters() - lm_head + config.hidden_size) << preset;
  }
}

TEST_F(TransformerTest, InitialisationIsSeededAndHfLike) {
  auto config = small_config(true);
  torch::manual_seed(3);
  CausalLM a(config);
  torch::manual_seed(3);
  CausalLM b(config);
  auto pb = b->named_parameters();
  for (const auto& item : a->named_parameters()) EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
  auto pa = a->named_parameters();
  EXPECT_TRUE(torch::equal(pa["model.norm.weight"], torch::ones({config.hidden_size})));
  EXPECT_TRUE(torch::equal(pa["model.layers.0.self_attn.q_proj.bias"], torch::zeros({config.hidden_size})));
  const double std = pa["model.embed_tokens.weight"].std().item<double>();
  EXPECT_NEAR(std, 0.02, 0.003);
}

TEST_F(TransformerTest, ConfigValidationNamesTheField) {
  auto config = small_config();
  config.num_key_value_heads = 3;
  try {
    config.validate();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads"), std::string::npos) << e.what();
  }
  EXPECT_THROW(preset_model_config("huge", 10), Error);
  EXPECT_THROW(preset_model_config("tiny", 0), Error);
}

TEST_F(TransformerTest, GroupedQueryAttentionEqualsRepeatedHeads) {
  // A GQA model must equal a full multi-head model whose k/v heads are the GQA heads repeated per group.
  auto gqa_config = small_config();
  CausalLM gqa(gqa_config);
  auto mha_config = gqa_config;
  mha_config.num_key_value_heads = mha_config.num_attention_heads;
  CausalLM mha(mha_config);
  const int64_t d = gqa_config.head_dim(), group = gqa_config.num_attention_heads / gqa_config.num_key_value_heads;
  EXPECT_EQ(gqa->named_parameters()["model.layers.0.self_attn.k_proj.weight"].size(0),
            gqa_config.num_key_value_heads * d);
  {
    torch::NoGradGuard no_grad;
    auto src = gqa->named_parameters();
    for (auto& item : mha->named_parameters()) {
      const auto& name = item.key();
      auto source = src[name];
      if (name.find("k_proj") != std::string::npos || name.find("v_proj") != std::string::npos) {
        source = source.view({gqa_config.num_key_value_heads, 1, d, -1})
                     .expand({gqa_config.num_key_value_heads, group, d, source.size(1)})
                     .reshape({-1, source.size(1)});
      }
      item.value().copy_(source);
    }
  }
  auto ids = torch::randint(0, gqa_config.vocab_size, {2, 7}, torch::kInt64);
  auto mask = torch::ones({2, 7}, torch::kInt64);
  EXPECT_LT(max_diff(gqa->forward(ids, mask).logits, mha->forward(ids, mask).logits), 1e-5);
}

TEST_F(TransformerTest, CausalEarlierLogitsIgnoreLaterTokens) {
  auto config = small_config();
  CausalLM model(config);
  auto ids = torch::randint(0, config.vocab_size, {1, 8}, torch::kInt64);
  auto changed = ids.clone();
  changed[0][5] = (ids[0][5].item<int64_t>() + 1) % config.vocab_size;
  auto mask = torch::ones({1, 8}, torch::kInt64);
  auto a = model->forward(ids, mask).logits, b = model->forward(changed, mask).logits;
  EXPECT_TRUE(torch::equal(a.slice(1, 0, 5), b.slice(1, 0, 5)));
  EXPECT_GT(max_diff(a.slice(1, 5), b.slice(1, 5)), 1e-4);
}

TEST_F(TransformerTest, PaddedBatchMatchesSequencesAlone) {
  // Tolerance 1e-4: only the padded matmul shapes differ, so float32 rounding is the whole gap.
  for (bool qwen2 : {false, true}) {
    auto config = small_config(qwen2);
    CausalLM model(config);
    auto long_seq = torch::randint(0, config.vocab_size, {1, 7}, torch::kInt64);
    auto short_seq = torch::randint(0, config.vocab_size, {1, 4}, torch::kInt64);
    auto alone_long = model->forward(long_seq, torch::ones({1, 7}, torch::kInt64)).logits;
    auto alone_short = model->forward(short_seq, torch::ones({1, 4}, torch::kInt64)).logits;

    auto left = torch::full({2, 7}, 0, torch::kInt64);
    left[0] = long_seq[0];
    left[1].slice(0, 3) = short_seq[0];
    auto left_mask = torch::ones({2, 7}, torch::kInt64);
    left_mask[1].slice(0, 0, 3) = 0;
    auto left_logits = model->forward(left, left_mask).logits;
    EXPECT_LT(max_diff(left_logits[0], alone_long[0]), 1e-4);
    EXPECT_LT(max_diff(left_logits[1].slice(0, 3), alone_short[0]), 1e-4);
    EXPECT_FALSE(torch::isnan(left_logits).any().item<bool>());

    auto right = torch::full({2, 7}, 0, torch::kInt64);
    right[0] = long_seq[0];
    right[1].slice(0, 0, 4) = short_seq[0];
    auto right_mask = torch::ones({2, 7}, torch::kInt64);
    right_mask[1].slice(0, 4) = 0;
    auto right_logits = model->forward(right, right_mask).logits;
    EXPECT_LT(max_diff(right_logits[1].slice(0, 0, 4), alone_short[0]), 1e-4);
  }
}

// Without a cache the attention takes one of three layouts (causal over whole rows, causal run by run, the
// additive mask): for the same real tokens, under grouped-query attention, they give the same logits and
// gradients within 1e-5. The mask is forced by a batch of rows padded in front (each row twice, so its
// gradient is twice one row's); run by run by a packed row holding the sequence and another; causal by one
// unpadded row.
TEST_F(TransformerTest, CausalLayoutsEqualTheMaskedAttention) {
  auto config = small_config();
  ASSERT_GT(config.num_attention_heads, config.num_key_value_heads);
  CausalLM model(config);
  const int64_t len = 9, pad = 3;
  auto seq = torch::randint(0, config.vocab_size, {1, len}, torch::kInt64);
  auto weights = torch::randn({1, len, config.vocab_size});
  auto padded = torch::constant_pad_nd(seq, {pad, 0});
  auto padded_mask = torch::ones({1, pad + len}, torch::kInt64);
  padded_mask.narrow(1, 0, pad).zero_();
  // The real positions' logits and the gradient of a weighted sum of them, per row of the input.
  auto run = [&](const torch::Tensor& ids, const torch::Tensor& mask, int64_t first) {
    model->zero_grad();
    auto logits = model->forward(ids, mask).logits.narrow(1, first, len);
    (logits * weights).sum().backward();
    std::map<std::string, torch::Tensor> grads;
    for (const auto& item : model->named_parameters()) grads[item.key()] = item.value().grad().clone() / ids.size(0);
    return std::make_pair(logits.detach()[0], grads);
  };
  auto [causal_logits, causal_grads] = run(seq, torch::ones({1, len}, torch::kInt64), 0);
  auto packed = torch::cat({seq, torch::randint(0, config.vocab_size, {1, 5}, torch::kInt64)}, 1);
  auto packed_mask = torch::cat({torch::ones({1, len}, torch::kInt64), torch::full({1, 5}, 2, torch::kInt64)}, 1);
  auto [runs_logits, runs_grads] = run(packed, packed_mask, 0);
  auto [mask_logits, mask_grads] = run(padded.repeat({2, 1}), padded_mask.repeat({2, 1}), pad);
  EXPECT_LT(max_diff(causal_logits, mask_logits), 1e-5);
  EXPECT_LT(max_diff(runs_logits, mask_logits), 1e-5);
  for (const auto& [name, grad] : mask_grads) {
    EXPECT_LT(max_diff(causal_grads[name], grad), 1e-5) << name;
    EXPECT_LT(max_diff(runs_grads[name], grad), 1e-5) << name;
  }
}

TEST_F(TransformerTest, FullyPaddedRowStaysFinite) {
  auto config = small_config();
  CausalLM model(config);
  auto ids = torch::randint(0, config.vocab_size, {2, 5}, torch::kInt64);
  auto mask = torch::ones({2, 5}, torch::kInt64);
  mask[1].zero_();
  auto out = model->forward(ids, mask).logits;
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
}

TEST_F(TransformerTest, CachedDecodingEqualsFullForward) {
  auto config = small_config(true);
  CausalLM model(config);
  auto ids = torch::randint(0, config.vocab_size, {2, 9}, torch::kInt64);
  auto mask = torch::ones({2, 9}, torch::kInt64);
  mask[1].slice(0, 0, 2) = 0;  // second row left-padded
  auto full = model->forward(ids, mask).logits;

  KVCache cache;
  auto prefill = model->forward(ids.slice(1, 0, 4), mask.slice(1, 0, 4), {}, &cache);
  EXPECT_EQ(cache.length(), 4);
  // Padding positions carry meaningless logits; compare real tokens only.
  auto real = mask.slice(1, 0, 4).unsqueeze(-1).to(torch::kFloat32);
  EXPECT_LT(max_diff(prefill.logits * real, full.slice(1, 0, 4) * real), 1e-4);
  for (int64_t t = 4; t < 9; ++t) {
    auto step = model->forward(ids.slice(1, t, t + 1), mask.slice(1, 0, t + 1), {}, &cache);
    EXPECT_EQ(cache.length(), t + 1);
    EXPECT_LT(max_diff(step.logits, full.slice(1, t, t + 1)), 1e-4) << "step " << t;
  }
  // Dropping a row from the cache keeps decoding the remaining one correctly.
  KVCache partial;
  model->forward(ids.slice(1, 0, 8), mask.slice(1, 0, 8), {}, &partial);
  partial.select_rows(torch::tensor({1}, torch::kInt64));
  auto last = model->forward(ids.slice(0, 1, 2).slice(1, 8, 9), mask.slice(0, 1, 2), {}, &partial);
  EXPECT_LT(max_diff(last.logits[0][0], full[1][8]), 1e-4);
}

// Reference for a one-layer model written with scalar loops in float64.
torch::Tensor naive_logits(const CausalLM& model, const ModelConfig& c, const std::vector<int64_t>& tokens) {
  auto p = model->named_parameters();
  auto get = [&](const std::string& name) { return p[name].detach().to(torch::kFloat64); };
  const int64_t T = tokens.size(), H = c.hidden_size, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t d = c.head_dim();
  auto rms = [&](const torch::Tensor& x, const torch::Tensor& w) {
    auto out = torch::empty_like(x);
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < H; ++i) ss += x[t][i].item<double>() * x[t][i].item<double>();
      const double scale = 1.0 / std::sqrt(ss / H + c.rms_norm_eps);
      for (int64_t i = 0; i < H; ++i) out[t][i] = x[t][i].item<double>() * scale * w[i].item<double>();
    }
    return out;
  };
  auto rope = [&](torch::Tensor x /* [T, heads, d] */) {
    auto out = x.clone();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < x.size(1); ++h)
        for (int64_t i = 0; i < d / 2; ++i) {
          const double angle = t / std::pow(c.rope_theta, 2.0 * i / d);
          const double a = x[t][h][i].item<double>(), b = x[t][h][i + d / 2].item<double>();
          out[t][h][i] = a * std::cos(angle) - b * std::sin(angle);
          out[t][h][i + d / 2] = b * std::cos(angle) + a * std::sin(angle);
        }
    return out;
  };
  auto x = torch::empty({T, H}, torch::kFloat64);
  auto emb = get("model.embed_tokens.weight");
  for (int64_t t = 0; t < T; ++t) x[t] = emb[tokens[t]];
  const std::string pre = "model.layers.0.";
  auto hn = rms(x, get(pre + "input_layernorm.weight"));
  auto proj = [&](const std::string& name) {
    auto y = torch::mm(hn, get(pre + "self_attn." + name + ".weight").t());
    if (c.attention_bias) y = y + get(pre + "self_attn." + name + ".bias");
    return y;
  };
  auto q = rope(proj("q_proj").view({T, nh, d}));
  auto k = rope(proj("k_proj").view({T, nkv, d}));
  auto v = proj("v_proj").view({T, nkv, d});
  auto attn = torch::zeros({T, nh, d}, torch::kFloat64);
  for (int64_t h = 0; h < nh; ++h) {
    const int64_t kvh = h / (nh / nkv);
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> w(i + 1);
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        w[j] = (q[i][h] * k[j][kvh]).sum().item<double>() / std::sqrt(static_cast<double>(d));
        mx = std::max(mx, w[j]);
      }
      for (auto& wj : w) sum += (wj = std::exp(wj - mx));
      for (int64_t j = 0; j <= i; ++j) attn[i][h] += v[j][kvh] * (w[j] / sum);
    }
  }
  x = x + torch::mm(attn.view({T, H}), get(pre + "self_attn.o_proj.weight").t());
  auto h2 = rms(x, get(pre + "post_attention_layernorm.weight"));
  auto gate = torch::mm(h2, get(pre + "mlp.gate_proj.weight").t());
  auto up = torch::mm(h2, get(pre + "mlp.up_proj.weight").t());
  x = x + torch::mm(gate / (1 + torch::exp(-gate)) * up, get(pre + "mlp.down_proj.weight").t());
  x = rms(x, get("model.norm.weight"));
  auto head = c.tie_word_embeddings ? emb : get("lm_head.weight");
  return torch::mm(x, head.t());
}

TEST_F(TransformerTest, MatchesNaiveReferenceLayer) {
  for (bool qwen2 : {false, true}) {
    auto config = small_config(qwen2);
    config.num_hidden_layers = 1;
    config.rope_theta = qwen2 ? 1e6 : 1e4;
    CausalLM model(config);
    {
      // Non-trivial norms and biases so their handling is checked too.
      torch::NoGradGuard no_grad;
      for (auto& item : model->named_parameters())
        if (item.key().find("norm") != std::string::npos || item.key().find("bias") != std::string::npos)
          item.value().uniform_(0.5, 1.5);
    }
    std::vector<int64_t> tokens = {3, 17, 0, 36, 9, 9};
    auto ids = torch::tensor(tokens, torch::kInt64).unsqueeze(0);
    auto logits = model->forward(ids, torch::ones_like(ids)).logits[0];
    auto expected = naive_logits(model, config, tokens);
    EXPECT_LT(max_diff(logits, expected), 1e-4) << (qwen2 ? "qwen2" : "llama");
  }
}

// The decode tests' models: a preset at this width, 2 layers, 4 query heads sharing 2 KV heads, and a
// sliding window (where the preset has one) shorter than the sequences.
ModelConfig decode_test_config(const std::string& preset, int64_t hidden, int64_t ffn, int64_t window) {
  ModelConfig config = preset_model_config(preset, 37);
  config.hidden_size = hidden;
  config.intermediate_size = ffn;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.max_position_embeddings = 64;
  if (config.sliding_window > 0) config.sliding_window = window;
  return config;
}

// Continuous batching's decode step (decode_slots): rows of different lengths in slots out of order, each
// token's logits equal to a full forward over its own sequence. Both implementations: the fused CPU kernels
// (gradients off) and the tensor operators (gradients on), at few rows (matrix-vector kernel) and many
// (matrix multiply), for Llama-style GQA, Qwen2 (biases, tied head), Qwen3 (q/k norms, wide heads) and
// Mistral with a sliding window shorter than the sequences.
// The last case is wide enough that the fused step splits its layers over two threads.
TEST_F(TransformerTest, DecodeSlotsEqualsFullForward) {
  for (const std::string preset : {"tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny", "tiny two threads"}) {
    const bool wide = preset == "tiny two threads";
    const ModelConfig config = decode_test_config(wide ? "tiny" : preset, wide ? 128 : 32, wide ? 2048 : 48, 4);
    at::set_num_threads(wide ? 2 : 1);
    torch::manual_seed(5);
    CausalLM model(config);
    model->eval();
    for (int64_t rows : {int64_t{3}, int64_t{11}}) {
      for (int variant = 0; variant < 4; ++variant) {
        // Fused kernels with slots out of order; operators with slots out of order (gathered) and in order
        // (the cache read as a view); the fused decode kernels' CPU references (the CUDA decode path's
        // arithmetic) with slots out of order.
        const bool fused = variant == 0, in_order = variant == 2, decode_kernels = variant == 3;
        const std::string what = preset + " rows " + std::to_string(rows) +
                                 (fused ? " fused" : decode_kernels ? " decode kernels" : " operators") +
                                 (in_order ? " in slot order" : "");
        const int64_t steps = 3, slots = rows + 2;
        std::vector<torch::Tensor> sequences;
        std::vector<int64_t> slot_of, lengths;
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t prompt = 1 + (r * 5) % 6;
          sequences.push_back(torch::randint(0, config.vocab_size, {1, prompt + steps}, torch::kInt64));
          slot_of.push_back(in_order ? r : (r * 3 + 1) % slots);
          lengths.push_back(prompt);
        }
        KVCache cache;
        {
          torch::NoGradGuard no_grad;
          for (int64_t r = 0; r < rows; ++r) {
            KVCache prefill;
            model->hidden_states(sequences[r].narrow(1, 0, lengths[r]), torch::ones({1, lengths[r]}, torch::kInt64), {},
                                 &prefill);
            for (size_t l = 0; l < prefill.keys.size(); ++l) {
              if (cache.keys.size() <= l) {
                const auto& k = prefill.keys[l];
                cache.keys.push_back(torch::zeros({slots, k.size(1), 16, k.size(3)}));
                cache.values.push_back(torch::zeros({slots, k.size(1), 16, k.size(3)}));
              }
              cache.keys[l][slot_of[r]].narrow(1, 0, lengths[r]).copy_(prefill.keys[l][0].narrow(1, 0, lengths[r]));
              cache.values[l][slot_of[r]].narrow(1, 0, lengths[r]).copy_(prefill.values[l][0].narrow(1, 0, lengths[r]));
            }
          }
        }
        for (int64_t step = 0; step < steps; ++step) {
          auto ids = torch::empty({rows, 1}, torch::kInt64);
          for (int64_t r = 0; r < rows; ++r) ids[r][0] = sequences[r][0][lengths[r]];
          torch::Tensor logits;
          if (decode_kernels) {
            torch::NoGradGuard no_grad;
            const auto saved = kernels::mode();
            kernels::set_mode(kernels::Mode::kEverywhere);
            logits = model->apply_head(model->decode_slots(ids, slot_of, lengths, cache)).logits;
            kernels::set_mode(saved);
          } else if (fused) {
            torch::NoGradGuard no_grad;
            logits = model->apply_head(model->decode_slots(ids, slot_of, lengths, cache)).logits;
          } else {
            torch::AutoGradMode grad(true);
            logits = model->apply_head(model->decode_slots(ids, slot_of, lengths, cache)).logits.detach();
          }
          ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{rows, 1, config.vocab_size})) << what;
          torch::NoGradGuard no_grad;
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t len = lengths[r] + 1;
            auto full = model->forward(sequences[r].narrow(1, 0, len), torch::ones({1, len}, torch::kInt64)).logits;
            EXPECT_LT(max_diff(logits[r][0], full[0][len - 1]), 1e-4) << what << " step " << step << " row " << r;
            lengths[r] = len;
          }
        }
      }
    }
  }
}

// The same step on a paged cache (decode_paged): each row's positions in blocks of 2 taken from a shuffled
// pool, so tables cross blocks in no order and rows of different lengths have tables of different widths;
// prompts written by PagedKVCache::write_prefill. Every token's logits equal a full forward, through the
// fused kernels and the operators (which gather the blocks), with Mistral's window spanning several blocks; and
// through the fused decode kernels' CPU references (kernels/decode_kernels.h: the CUDA decode path's arithmetic,
// reading the blocks in place).
TEST_F(TransformerTest, DecodePagedEqualsFullForward) {
  for (const std::string preset : {"tiny", "qwen3-tiny", "mistral-tiny"}) {
    const ModelConfig config = decode_test_config(preset, 32, 48, 5);
    at::set_num_threads(1);
    torch::manual_seed(6);
    CausalLM model(config);
    model->eval();
    for (int64_t rows : {int64_t{3}, int64_t{11}}) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool fused = variant == 0, decode_kernels = variant >= 2, few_rows_linear = variant == 3;
        const std::string what = preset + " rows " + std::to_string(rows) +
                                 (fused                ? " fused"
                                  : few_rows_linear ? " decode kernels + few-rows projections"
                                  : decode_kernels  ? " decode kernels"
                                                    : " operators");
        const int64_t steps = 4, block_size = 2, blocks = rows * 8;
        std::vector<int64_t> pool(static_cast<size_t>(blocks));
        for (int64_t b = 0; b < blocks; ++b) pool[static_cast<size_t>(b)] = (b * 7 + 3) % blocks;  // 7 is prime to 8k
        size_t next_block = 0;
        std::vector<torch::Tensor> sequences;
        std::vector<std::vector<int64_t>> tables(static_cast<size_t>(rows));
        std::vector<int64_t> lengths;
        PagedKVCache cache;
        torch::NoGradGuard no_grad;
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t prompt = 1 + (r * 5) % 7;
          sequences.push_back(torch::randint(0, config.vocab_size, {1, prompt + steps}, torch::kInt64));
          lengths.push_back(prompt);
          auto& table = tables[static_cast<size_t>(r)];
          while (static_cast<int64_t>(table.size()) * block_size < prompt) table.push_back(pool[next_block++]);
          KVCache prefill;
          model->hidden_states(sequences[r].narrow(1, 0, prompt), torch::ones({1, prompt}, torch::kInt64), {}, &prefill);
          if (cache.keys.empty())
            for (const auto& k : prefill.keys) {
              cache.keys.push_back(torch::zeros({blocks, k.size(1), block_size, k.size(3)}));
              cache.values.push_back(torch::zeros({blocks, k.size(1), block_size, k.size(3)}));
            }
          cache.write_prefill(prefill, {table}, {prompt});
        }
        for (int64_t step = 0; step < steps; ++step) {
          auto ids = torch::empty({rows, 1}, torch::kInt64);
          for (int64_t r = 0; r < rows; ++r) {
            ids[r][0] = sequences[r][0][lengths[r]];
            auto& table = tables[static_cast<size_t>(r)];
            if (lengths[r] == static_cast<int64_t>(table.size()) * block_size) table.push_back(pool[next_block++]);
          }
          torch::Tensor logits;
          if (decode_kernels) {
            const auto saved = kernels::mode();
            const bool saved_few_rows = kernels::few_rows_linear_enabled();
            kernels::set_mode(kernels::Mode::kEverywhere);
            kernels::set_few_rows_linear_enabled(few_rows_linear);
            testing::OperatorCounter counter;
            logits = model->apply_head(model->decode_paged(ids, tables, lengths, cache)).logits;
            kernels::set_mode(saved);
            kernels::set_few_rows_linear_enabled(saved_few_rows);
            // The few-rows kernels took the step's projections (q/k/v, o, gate/up, down) where the rows allow.
            const int64_t expected = few_rows_linear && rows <= kernels::kFewRowsMax ? 4 * config.num_hidden_layers : 0;
            EXPECT_EQ(counter.named_calls("hybridflow::few_rows"), expected) << what;
          } else if (fused) {
            logits = model->apply_head(model->decode_paged(ids, tables, lengths, cache)).logits;
          } else {
            torch::AutoGradMode grad(true);
            logits = model->apply_head(model->decode_paged(ids, tables, lengths, cache)).logits.detach();
          }
          ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{rows, 1, config.vocab_size})) << what;
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t len = lengths[r] + 1;
            auto full = model->forward(sequences[r].narrow(1, 0, len), torch::ones({1, len}, torch::kInt64)).logits;
            EXPECT_LT(max_diff(logits[r][0], full[0][len - 1]), 1e-4) << what << " step " << step << " row " << r;
            lengths[r] = len;
          }
        }
      }
    }
  }
  // A table that does not reach the row's position is refused, naming the row.
  ModelConfig config = preset_model_config("tiny", 37);
  config.hidden_size = 32;
  config.intermediate_size = 48;
  CausalLM model(config);
  PagedKVCache cache;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    cache.keys.push_back(torch::zeros({4, config.num_key_value_heads, 2, config.head_dim()}));
    cache.values.push_back(torch::zeros({4, config.num_key_value_heads, 2, config.head_dim()}));
  }
  torch::NoGradGuard no_grad;
  try {
    model->decode_paged(torch::zeros({1, 1}, torch::kInt64), {{0}}, {2}, cache);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 0 has 2 cached positions; its block table holds 2"), std::string::npos)
        << e.what();
  }
}

// PagedKVCache::gather lays rows of several cached lengths into one slab, each ending at the longest (zeros
// before it) with room after for a forward's new keys; write_prefill's shifts put those new keys back at their
// sequence positions. A round trip through distinct blocks gives back every position's values.
TEST_F(TransformerTest, PagedGatherRightAlignsRowsAndShiftedWritesPutThemBack) {
  const int64_t kv = 2, bs = 2, d = 3;
  PagedKVCache cache;
  cache.keys.push_back(torch::arange(8 * kv * bs * d, torch::kFloat32).view({8, kv, bs, d}) + 1);  // no zeros
  cache.values.push_back(-cache.keys[0]);
  const std::vector<std::vector<int64_t>> tables = {{5, 2}, {7}, {1, 6, 3}};
  const std::vector<int64_t> lengths = {3, 0, 5};
  const KVCache got = cache.gather(tables, lengths, 7);
  ASSERT_EQ(got.keys.size(), 1u);
  EXPECT_EQ(got.filled, 5);
  EXPECT_EQ(got.keys[0].sizes(), torch::IntArrayRef({3, kv, 7, d}));
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t p = 0; p < 5; ++p) {
      const int64_t own = p - (5 - lengths[static_cast<size_t>(r)]);  // the row's position at slab position p
      const torch::Tensor want = own < 0 ? torch::zeros({kv, d})
                                         : cache.keys[0][tables[static_cast<size_t>(r)][static_cast<size_t>(own / bs)]]
                                               .select(1, own % bs);
      EXPECT_TRUE(torch::equal(got.keys[0][r].select(1, p), want)) << "row " << r << " slab position " << p;
      EXPECT_TRUE(torch::equal(got.values[0][r].select(1, p), -want)) << "row " << r << " slab position " << p;
    }
  // Back into fresh blocks at shifts 5 - length: each row's positions where they were.
  PagedKVCache copy;
  copy.keys.push_back(torch::zeros_like(cache.keys[0]));
  copy.values.push_back(torch::zeros_like(cache.values[0]));
  copy.write_prefill(got, tables, lengths, {0, 0, 0}, {2, 5, 0});
  for (int64_t r : {0, 2})
    for (int64_t p = 0; p < lengths[static_cast<size_t>(r)]; ++p) {
      const int64_t block = tables[static_cast<size_t>(r)][static_cast<size_t>(p / bs)];
      EXPECT_TRUE(torch::equal(copy.keys[0][block].select(1, p % bs), cache.keys[0][block].select(1, p % bs)))
          << "row " << r << " position " << p;
    }
  EXPECT_NE(testing::error_of([&] { cache.gather(tables, lengths, 4); }).find("a capacity of 4 positions for rows of up to 5"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { cache.gather({{1}}, {3}, 8); }).find("row 0 has 3 positions in 1 blocks of 2"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { copy.write_prefill(got, {{5, 2}}, {3}, {0}, {5}); }).find("at slab shift 5"),
            std::string::npos);
}

TEST_F(TransformerTest, BFloat16ParametersRun) {
  auto config = small_config(true);
  CausalLM model(config);
  auto ids = torch::randint(0, config.vocab_size, {2, 6}, torch::kInt64);
  auto mask = torch::ones({2, 6}, torch::kInt64);
  mask[1][0] = 0;
  auto reference = model->forward(ids, mask).logits;
  model->to(torch::kBFloat16);
  auto logits = model->forward(ids, mask).logits;
  EXPECT_EQ(logits.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
  // bf16 keeps ~3 significant digits; logits here are O(0.1).
  EXPECT_LT(max_diff(logits, reference), 2e-2);
  EXPECT_GT(max_diff(logits, reference), 0.0);
}

}  // namespace
}  // namespace hybridflow
