// Direct preference optimisation: the loss formulas (sigmoid with label smoothing, IPO), sequence log-probs
// against the full log-softmax, and that a tiny model trained on a task's pairs comes to prefer the chosen
// answers on held-out prompts while its reference stays as it was.
#include "hybridflow/finetune/dpo.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/model/lora_config.h"
#include "hybridflow/tasks/dataset.h"
#include "hybridflow/tasks/task.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

double log_sigmoid(double x) { return -std::log1p(std::exp(-x)); }

TEST(DpoLoss, MatchesTheFormulas) {
  const std::vector<double> pc = {-1.5, -0.25, -3.0, -2.0}, pr = {-2.5, -0.5, -1.0, -2.0};
  const std::vector<double> rc = {-1.0, -0.5, -2.5, -1.0}, rr = {-1.75, -0.25, -1.5, -3.0};
  auto t = [](const std::vector<double>& v) { return torch::tensor(v, torch::kDouble); };
  for (double beta : {0.1, 0.5}) {
    for (double eps : {0.0, 0.2}) {
      double sigmoid = 0, ipo = 0;
      for (size_t i = 0; i < pc.size(); ++i) {
        const double m = (pc[i] - rc[i]) - (pr[i] - rr[i]);
        sigmoid += -(1 - eps) * log_sigmoid(beta * m) - eps * log_sigmoid(-beta * m);
        ipo += std::pow(m - 1.0 / (2.0 * beta), 2);
      }
      const double n = static_cast<double>(pc.size());
      EXPECT_NEAR(dpo_loss(t(pc), t(pr), t(rc), t(rr), beta, eps).item<double>(), sigmoid / n, 1e-12) << beta << " " << eps;
      EXPECT_NEAR(dpo_loss(t(pc), t(pr), t(rc), t(rr), beta, 0, DpoLossType::kIpo).item<double>(), ipo / n, 1e-12);
    }
  }
  // The policy equal to its reference: every margin 0, the loss log 2, and the gradient raises the chosen
  // log-probs and lowers the rejected ones by beta / 2 / B each.
  auto c = t(rc).requires_grad_(true), r = t(rr).requires_grad_(true);
  auto loss = dpo_loss(c, r, t(rc), t(rr), 0.5);
  EXPECT_NEAR(loss.item<double>(), std::log(2.0), 1e-12);
  loss.backward();
  EXPECT_TRUE(torch::allclose(c.grad(), torch::full({4}, -0.5 / 2 / 4, torch::kDouble)));
  EXPECT_TRUE(torch::allclose(r.grad(), torch::full({4}, 0.5 / 2 / 4, torch::kDouble)));
}

TEST(DpoLoss, BadArgumentsNameTheKey) {
  const auto x = torch::zeros({3});
  EXPECT_NE(testing::error_of([&] { dpo_loss(x, x, x, x, 0.0); }).find("dpo.beta"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { dpo_loss(x, x, x, x, 0.1, 0.5); }).find("dpo.label_smoothing"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { dpo_loss(x, torch::zeros({2}), x, x, 0.1); }).find("one shape"),
            std::string::npos);
  EXPECT_EQ(parse_dpo_loss_type("ipo"), DpoLossType::kIpo);
  EXPECT_NE(testing::error_of([] { parse_dpo_loss_type("hinge"); }).find("dpo.loss_type"), std::string::npos);
}

// SimPO and ORPO from their formulas, on mean token log-probs (no reference), and refused where they do not apply.
TEST(DpoLoss, ReferenceFreeLossesMatchTheFormulas) {
  const std::vector<double> cw = {-0.5, -1.2, -0.05}, cl = {-0.9, -0.4, -2.0};
  auto t = [](const std::vector<double>& v) { return torch::tensor(v, torch::kDouble); };
  const auto nll = torch::tensor(0.7, torch::kDouble);
  const double beta = 2.0, gamma = 0.5, eps = 0.1, n = 3;
  double simpo = 0, odds = 0;
  for (size_t i = 0; i < cw.size(); ++i) {
    const double logits = beta * (cw[i] - cl[i]) - gamma;
    simpo += -(1 - eps) * log_sigmoid(logits) - eps * log_sigmoid(-logits);
    const double log_odds = (cw[i] - cl[i]) - (std::log(1 - std::exp(cw[i])) - std::log(1 - std::exp(cl[i])));
    odds += log_sigmoid(log_odds);
  }
  EXPECT_NEAR(reference_free_preference_loss(t(cw), t(cl), nll, beta, DpoLossType::kSimpo, eps, gamma).item<double>(),
              simpo / n, 1e-12);
  EXPECT_NEAR(reference_free_preference_loss(t(cw), t(cl), nll, beta, DpoLossType::kOrpo).item<double>(),
              0.7 - beta * odds / n, 1e-12);
  // ORPO's odds stay finite for a response the model is nearly sure of (mean log-prob -1e-9).
  EXPECT_TRUE(std::isfinite(
      reference_free_preference_loss(t({-1e-9}), t({-3.0}), nll, beta, DpoLossType::kOrpo).item<double>()));
  EXPECT_TRUE(dpo_loss_is_reference_free(parse_dpo_loss_type("simpo")));
  EXPECT_TRUE(dpo_loss_is_reference_free(parse_dpo_loss_type("orpo")));
  EXPECT_FALSE(dpo_loss_is_reference_free(DpoLossType::kSigmoid));
  const auto x = torch::zeros({3});
  EXPECT_NE(testing::error_of([&] { dpo_loss(x, x, x, x, 0.1, 0, DpoLossType::kSimpo); }).find("no reference"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { reference_free_preference_loss(x, x, nll, 0.1, DpoLossType::kIpo); }).find("reference"),
            std::string::npos);
}

// The chunked head's per-row sums over the response positions equal the full logits' log-softmax gathered
// at the targets, right padding included.
TEST(DpoSequenceLogProbs, EqualTheFullLogSoftmaxOverTheResponse) {
  CausalLM model = testing::seeded_model(testing::tiny_model_config({.vocab_size = 23}), 4);
  model->eval();
  torch::manual_seed(8);
  const int64_t b = 3, t = 9;
  const auto ids = torch::randint(3, 23, {b, t}, torch::kLong);
  const auto lengths = std::vector<int64_t>{9, 6, 4};
  const auto prompts = std::vector<int64_t>{3, 2, 2};
  auto mask = torch::zeros({b, t}, torch::kLong), loss_mask = torch::zeros({b, t}, torch::kLong);
  auto targets = torch::zeros({b, t}, torch::kLong);
  for (int64_t r = 0; r < b; ++r) {
    mask[r].narrow(0, 0, lengths[r]).fill_(1);
    targets[r].narrow(0, 0, t - 1).copy_(ids[r].narrow(0, 1, t - 1));
    // Targets at positions prompt - 1 .. length - 2: the response's tokens.
    loss_mask[r].narrow(0, prompts[r] - 1, lengths[r] - prompts[r]).fill_(1);
  }
  torch::NoGradGuard no_grad;
  const auto got = sequence_log_probs(model, ids, mask, targets, loss_mask);
  const auto full = torch::log_softmax(model->forward(ids, mask).logits.to(torch::kFloat64), -1);
  for (int64_t r = 0; r < b; ++r) {
    double expected = 0;
    for (int64_t p = 0; p < t; ++p)
      if (loss_mask[r][p].item<int64_t>() == 1) expected += full[r][p][targets[r][p].item<int64_t>()].item<double>();
    EXPECT_NEAR(got[r].item<double>(), expected, 1e-4) << "row " << r;
  }
}

// Two-letter reversal pairs (chosen = the reversal, rejected = a one-letter corruption) in dir/train.jsonl
// (pairs_per_prompt a training prompt) and dir/test.jsonl (one a held-out prompt); returns the task's tokenizer.
Tokenizer write_reversal_pairs(testing::TempDir& dir, int64_t train_prompts, int64_t test_prompts,
                               int64_t pairs_per_prompt) {
  TaskOptions task_options;
  task_options.min_length = task_options.max_length = 2;
  auto task = make_task("reverse", task_options);
  const auto splits = make_splits(*task, train_prompts, test_prompts, 5);
  write_preference_jsonl(dir.file("train.jsonl"), make_preference_pairs(*task, splits.train, pairs_per_prompt, 11));
  write_preference_jsonl(dir.file("test.jsonl"), make_preference_pairs(*task, splits.test, 3));
  return Tokenizer::from_alphabet(task->alphabet());
}

// A tiny model on two-letter reversal pairs (chosen = the reversal, rejected = a one-letter corruption): at
// the first step the policy is its reference (loss log 2, margins 0); after training its implicit reward
// ranks most held-out pairs right, the loss has fallen, and the reference has not moved.
TEST(Dpo, TinyModelComesToPreferTheChosenAnswersOnHeldOutPrompts) {
  at::set_num_threads(1);
  testing::TempDir dir;
  const Tokenizer tok = write_reversal_pairs(dir, 300, 100, 2);
  const ModelConfig config = testing::tiny_model_config(tok, {.hidden_size = 64, .intermediate_size = 128}, "tiny");
  CausalLM policy = testing::seeded_model(config, 0), reference = testing::seeded_model(config, 0);
  const auto reference_before = reference->parameters().front().clone();

  DpoOptions o;
  o.train_file = dir.file("train.jsonl");
  o.eval_file = dir.file("test.jsonl");
  o.lr = 3e-3;
  o.schedule = "constant";
  o.beta = 0.5;
  o.batch_size = 32;
  o.micro_batch_size = 16;  // two micro-batches: a pair never splits across them
  o.steps = 120;
  o.eval_every = 60;
  o.max_new_tokens = 4;
  o.out_dir = dir.file("out");
  const DpoResult r = train_dpo(o, policy, reference, tok);
  ASSERT_EQ(r.history.size(), 120u);
  EXPECT_NEAR(r.history.front().loss, std::log(2.0), 1e-5);
  EXPECT_EQ(r.history.front().reward_margin, 0.0);
  const DpoMetrics& last = r.history.back();
  std::printf("loss %.3f -> %.3f, held-out reward accuracy %.3f, exact match %.3f -> %.3f\n", r.history.front().loss,
              last.loss, last.eval_reward_accuracy, r.initial_eval_accuracy, r.final_eval_accuracy);
  EXPECT_LT(last.loss, 0.5);
  EXPECT_GT(last.reward_margin, 0.5);
  EXPECT_GT(last.eval_reward_accuracy, 0.8);
  EXPECT_TRUE(torch::equal(reference->parameters().front(), reference_before));
  for (const auto& p : reference->parameters()) EXPECT_FALSE(p.requires_grad());
  // One metrics row a step, with the held-out figures at the evaluations.
  std::ifstream metrics(dir.file("out/dpo_metrics.jsonl"));
  int64_t lines = 0, evaluated = 0;
  for (std::string line; std::getline(metrics, line); ++lines) evaluated += line.find("eval_rewards/accuracies") != std::string::npos;
  EXPECT_EQ(lines, 120);
  EXPECT_EQ(evaluated, 2);
}

// SimPO and ORPO need no reference model (none is passed, and the policy has no adapters): both come to rank the
// held-out chosen answers above the rejected ones, and ORPO's likelihood term also teaches the answers.
TEST(Dpo, SimpoAndOrpoLearnThePreferenceWithoutAReference) {
  at::set_num_threads(1);
  testing::TempDir dir;
  const Tokenizer tok = write_reversal_pairs(dir, 300, 100, 2);
  const ModelConfig config = testing::tiny_model_config(tok, {.hidden_size = 64, .intermediate_size = 128}, "tiny");
  for (const DpoLossType type : {DpoLossType::kSimpo, DpoLossType::kOrpo}) {
    const bool simpo = type == DpoLossType::kSimpo;
    SCOPED_TRACE(simpo ? "simpo" : "orpo");
    CausalLM policy = testing::seeded_model(config, 0), none{nullptr};
    DpoOptions o;
    o.train_file = dir.file("train.jsonl");
    o.eval_file = dir.file("test.jsonl");
    o.lr = 3e-3;
    o.schedule = "constant";
    o.loss_type = type;
    o.beta = simpo ? 2.0 : 0.5;
    o.batch_size = 32;
    o.micro_batch_size = 16;
    o.steps = 120;
    o.eval_every = 60;
    o.max_new_tokens = 4;
    const DpoResult r = train_dpo(o, policy, none, tok);
    ASSERT_EQ(r.history.size(), 120u);
    const DpoMetrics& last = r.history.back();
    std::printf("%s: loss %.3f -> %.3f, held-out reward accuracy %.3f, exact match %.3f -> %.3f\n",
                simpo ? "simpo" : "orpo", r.history.front().loss, last.loss, last.eval_reward_accuracy,
                r.initial_eval_accuracy, r.final_eval_accuracy);
    EXPECT_LT(last.loss, r.history.front().loss);
    EXPECT_GT(last.reward_margin, 0.0);
    EXPECT_GT(last.eval_reward_accuracy, 0.8);
    if (!simpo) {
      EXPECT_GT(r.final_eval_accuracy, r.initial_eval_accuracy + 0.2);  // the NLL term is SFT on "chosen"
    }
  }
}

// With LoRA and no reference model the reference is the policy with its adapters off: the same run, to the
// bit, as with a separate copy of the base as the reference, without that copy's memory.
TEST(Dpo, WithLoraThePolicyWithAdaptersOffIsTheReference) {
  at::set_num_threads(1);
  testing::TempDir dir;
  const Tokenizer tok = write_reversal_pairs(dir, 64, 16, 1);
  const ModelConfig config = testing::tiny_model_config(tok, {}, "tiny");
  LoraConfig lora;
  lora.rank = 4;
  DpoOptions o;
  o.train_file = dir.file("train.jsonl");
  o.eval_file = dir.file("test.jsonl");
  o.lr = 1e-2;
  o.beta = 0.5;
  o.batch_size = 16;
  o.micro_batch_size = 8;
  o.steps = 6;
  o.eval_every = 3;
  o.max_new_tokens = 3;
  auto run = [&](bool separate_reference) {
    CausalLM policy = testing::seeded_model(config, 2);
    policy->add_lora(lora, 7);
    CausalLM reference{nullptr};
    if (separate_reference) reference = testing::seeded_model(config, 2);
    return train_dpo(o, policy, reference, tok);
  };
  const DpoResult off = run(false), copy = run(true);
  ASSERT_EQ(off.history.size(), copy.history.size());
  for (size_t i = 0; i < off.history.size(); ++i) {
    EXPECT_EQ(off.history[i].loss, copy.history[i].loss) << "step " << i + 1;
    EXPECT_EQ(off.history[i].reward_margin, copy.history[i].reward_margin) << "step " << i + 1;
    EXPECT_EQ(off.history[i].eval_reward_accuracy, copy.history[i].eval_reward_accuracy) << "step " << i + 1;
  }
  EXPECT_GT(off.history.back().reward_margin, 0.0);  // the adapters trained against the base
  CausalLM no_adapters = testing::seeded_model(config, 2);
  CausalLM none{nullptr};
  EXPECT_NE(testing::error_of([&] { train_dpo(o, no_adapters, none, tok); }).find("LoRA adapters off"),
            std::string::npos);
}

TEST(Dpo, BadPairRowIsNamedByFileAndLine) {
  testing::TempDir dir;
  std::ofstream(dir.file("pairs.jsonl")) << "{\"prompt\": \"ab=\", \"chosen\": \"ba\", \"rejected\": \"bb\"}\n"
                                         << "{\"prompt\": \"cd=\", \"chosen\": \"dc\"}\n";
  const Tokenizer tok = Tokenizer::from_alphabet("abcd=");
  const ModelConfig config = testing::tiny_model_config(tok, {}, "tiny");
  CausalLM policy = testing::seeded_model(config, 0), reference = testing::seeded_model(config, 0);
  DpoOptions o;
  o.train_file = dir.file("pairs.jsonl");
  o.steps = 1;
  const std::string e = testing::error_of([&] { train_dpo(o, policy, reference, tok); });
  EXPECT_NE(e.find(dir.file("pairs.jsonl") + ":2"), std::string::npos) << e;
  EXPECT_NE(e.find("rejected"), std::string::npos) << e;
}

}  // namespace
}  // namespace hybridflow
