#!/usr/bin/env python3
"""Hugging Face transformers as the oracle for hybridflow's mixture-of-experts models (qwen2_moe, qwen3_moe,
mixtral). Run by tests/model/test_moe_oracle.cpp with the project venv's python; shares the tokenizer, inputs,
weight scales and greedy decoding of tests/engine/hf_oracle.py.

  --reference-dir DIR   writes DIR/<name>/ for each name in MODELS: a random tiny model saved by transformers,
                        tokenizer.json, and reference.safetensors with input_ids / attention_mask (left padded),
                        the fp32 logits, the load-balancing aux_loss of that forward (over the unpadded tokens,
                        before router_aux_loss_coef) and the greedy continuation (generated).
  --score-dirs D...     for each directory D written by hybridflow: loads it with AutoModelForCausalLM and writes
                        D/transformers_logits.safetensors (input_ids, attention_mask, logits, aux_loss).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
try:
    import torch
    import transformers
    from safetensors.torch import save_file
    import hf_oracle as base
except ImportError as e:  # the C++ test turns this message into its failure
    sys.exit(f"moe_oracle.py: {e} in {sys.executable}; run scripts/setup.sh to install the test venv")

# Each model covers what the others do not: a shared expert with its sigmoid gate, a dense layer listed in
# mlp_only_layers and unnormalised top-k weights (qwen2_moe); renormalised top-k, decoder_sparse_step 2, q/k norms,
# a head_dim other than hidden / heads and tied embeddings (qwen3_moe); Mixtral's always-renormalised router with
# its w1/w2/w3 names and a sliding window shorter than the prompts (mixtral).
MODELS = {
    "qwen2_moe": dict(
        cls="Qwen2MoeForCausalLM", cfg="Qwen2MoeConfig", vocab_extra=3, seed=31,
        kwargs=dict(hidden_size=32, intermediate_size=40, moe_intermediate_size=12, shared_expert_intermediate_size=20,
                    num_experts=6, num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1],
                    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, rope_theta=700.0,
                    rms_norm_eps=1e-6, max_position_embeddings=64, router_aux_loss_coef=0.02,
                    tie_word_embeddings=False)),
    "qwen3_moe": dict(
        cls="Qwen3MoeForCausalLM", cfg="Qwen3MoeConfig", vocab_extra=0, seed=32,
        kwargs=dict(hidden_size=32, intermediate_size=36, moe_intermediate_size=12, num_experts=8, num_experts_per_tok=3,
                    norm_topk_prob=True, decoder_sparse_step=2, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, attention_bias=True, rope_theta=900.0, rms_norm_eps=1e-6,
                    max_position_embeddings=64, tie_word_embeddings=True)),
    "mixtral": dict(
        cls="MixtralForCausalLM", cfg="MixtralConfig", vocab_extra=2, seed=33,
        kwargs=dict(hidden_size=32, intermediate_size=20, num_local_experts=4, num_experts_per_tok=2,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, sliding_window=5,
                    rope_theta=1500.0, rms_norm_eps=1e-5, max_position_embeddings=64)),
}


def forward(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=base.position_ids(mask), output_router_logits=True)
    return out.logits.float().contiguous(), out.aux_loss.reshape(1).float()


def write_reference(root):
    tok, token_vocab = base.tokenizer_json()
    for name, spec in MODELS.items():
        out = os.path.join(root, name)
        config = getattr(transformers, spec["cfg"])(
            vocab_size=token_vocab + spec["vocab_extra"], bos_token_id=base.BOS, eos_token_id=base.EOS,
            pad_token_id=base.PAD, **spec["kwargs"])
        torch.manual_seed(spec["seed"])
        model = getattr(transformers, spec["cls"])(config)
        base.randomize(model, spec["seed"])
        model.save_pretrained(out, safe_serialization=True)
        with open(os.path.join(out, "tokenizer.json"), "w") as f:
            base.json.dump(tok, f, indent=2)
        model = base.load_eager(out)
        ids, mask = base.fixed_inputs(token_vocab)
        logits, aux_loss = forward(model, ids, mask)
        generated = base.greedy(out, ids, mask, base.EOS)
        save_file({"input_ids": ids, "attention_mask": mask, "logits": logits, "aux_loss": aux_loss,
                   "generated": generated}, os.path.join(out, "reference.safetensors"))


def score(directory):
    model = base.load_eager(directory)
    token_vocab = min(model.config.vocab_size, len(base.SPECIALS) + len(set(base.ALPHABET)))
    ids, mask = base.fixed_inputs(token_vocab)
    logits, aux_loss = forward(model, ids, mask)
    save_file({"input_ids": ids, "attention_mask": mask, "logits": logits, "aux_loss": aux_loss},
              os.path.join(directory, "transformers_logits.safetensors"))


if __name__ == "__main__":
    base.main(write_reference, score, __doc__)
