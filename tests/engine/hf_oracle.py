#!/usr/bin/env python3
"""Hugging Face transformers as an independent oracle for hybridflow's Llama / Mistral / Qwen2 / Qwen3 models.

Run by tests/engine/test_hf_oracle.cpp with the project venv's python (scripts/setup.sh installs
transformers there). Two jobs, done in one process so that transformers is imported once:

  --reference-dir DIR   writes DIR/<name>/ for each name in MODELS: a random tiny model saved with
                        transformers' save_pretrained (config.json, model.safetensors), a character-level
                        tokenizer.json in the format hybridflow reads, and reference.safetensors with
                        input_ids / attention_mask (left padded), the fp32 logits and the greedy
                        generate(do_sample=False) continuation of the same ids (stopping on EOS, and
                        again stopping on stop_token).
  --score-dirs D...     for each model directory D written by hybridflow: loads it with
                        AutoModelForCausalLM and writes D/transformers_logits.safetensors
                        (input_ids, attention_mask, logits, and tokenizer_ids: TOKENIZER_TEXT
                        encoded by transformers from D/tokenizer.json).

Weights are re-drawn after construction with non-trivial scales (random norms and biases, sharp
attention) because HF's own init (zero biases, unit norms, std 0.02) would hide bugs in those terms.
"""
import argparse
import json
import os
import sys

try:
    import torch
    import transformers
    from safetensors.torch import save_file
except ImportError as e:  # the C++ test turns this message into its failure
    sys.exit(f"hf_oracle.py: {e} in {sys.executable}; run scripts/setup.sh to install the test venv")

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
ALPHABET = "0123456789+=abcdefghij "
MAX_NEW_TOKENS = 6
TOKENIZER_TEXT = "12+34=46 abj"

# Each model exercises a different part of the mapping: tied embeddings + attention bias + GQA on
# Llama, a vocabulary larger than the tokenizer (as Qwen pads it) + GQA with one KV head on Qwen2, a
# sliding window shorter than the prompts and a head_dim other than hidden_size / heads on Mistral, per-head
# q/k norms with wide heads and biases on Qwen3, and each RoPE scaling type on Llama (with contexts small
# enough that the scaling changes these short sequences). All use a non-default rope_theta so that a config
# reader that drops it is caught.
LLAMA = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             rms_norm_eps=1e-5, max_position_embeddings=64)


def rope(rope_type, **extra):
    return dict(rope_parameters=dict(rope_type=rope_type, rope_theta=500.0, **extra))


MODELS = {
    "llama": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig", vocab_extra=0, seed=11,
        kwargs=dict(LLAMA, rope_theta=500.0, attention_bias=True, tie_word_embeddings=True)),
    "qwen2": dict(
        cls="Qwen2ForCausalLM", cfg="Qwen2Config", vocab_extra=5, seed=12,
        kwargs=dict(hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=6,
                    num_key_value_heads=1, rope_theta=2000.0, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, max_position_embeddings=64)),
    "mistral": dict(
        cls="MistralForCausalLM", cfg="MistralConfig", vocab_extra=2, seed=13,
        kwargs=dict(LLAMA, head_dim=12, sliding_window=4, rope_theta=800.0)),
    "qwen3": dict(
        cls="Qwen3ForCausalLM", cfg="Qwen3Config", vocab_extra=0, seed=14,
        kwargs=dict(LLAMA, head_dim=16, attention_bias=True, tie_word_embeddings=True, rope_theta=900.0)),
    "llama_rope_linear": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig", vocab_extra=0, seed=15, kwargs=dict(LLAMA, **rope("linear", factor=3.0))),
    "llama_rope_dynamic": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig", vocab_extra=0, seed=16,
        kwargs=dict(LLAMA, max_position_embeddings=4, **rope("dynamic", factor=2.0))),
    "llama_rope_llama3": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig", vocab_extra=0, seed=17,
        kwargs=dict(LLAMA, **rope("llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=16))),
    "llama_rope_yarn": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig", vocab_extra=0, seed=18,
        kwargs=dict(LLAMA, **rope("yarn", factor=4.0, original_max_position_embeddings=16))),
}


def tokenizer_json():
    """The tokenizer.json hybridflow's Tokenizer::save writes for ALPHABET (a WordLevel model)."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in ALPHABET:
        vocab.setdefault(ch, len(vocab))
    added = [dict(id=i, content=t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
             for i, t in enumerate(SPECIALS)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated",
                          "invert": False},
        "post_processor": None, "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }, len(vocab)


def fixed_inputs(token_vocab):
    """[3, 7] ids left-padded to lengths 7, 5 and 2, BOS first, characters after it."""
    g = torch.Generator().manual_seed(1234)
    lengths = [7, 5, 2]
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n] = BOS
        ids[row, width - n + 1:] = torch.randint(len(SPECIALS), token_vocab, (n - 1,), generator=g)
        mask[row, width - n:] = 1
    return ids, mask


def position_ids(mask):
    # What generate() and hybridflow derive from a left-padded mask; forward() alone would use arange.
    return (mask.cumsum(-1) - 1).clamp(min=0).masked_fill(mask == 0, 0)


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.5 * noise)
            elif name.endswith("embed_tokens.weight"):
                p.copy_(noise)
            else:  # [out, in]: unit-variance outputs, times 2 so attention is far from uniform
                p.copy_(2.0 * noise / p.shape[1] ** 0.5)


def load_eager(directory):
    return transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager").eval()


def greedy(directory, ids, mask, eos):
    # A fresh model per call: dynamic RoPE keeps the longest length a module has seen, so a second call on
    # the same module would rotate with the first call's base.
    model = load_eager(directory)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW_TOKENS,
                         eos_token_id=eos, pad_token_id=PAD)
    return out[:, ids.shape[1]:].contiguous()


def write_reference(root):
    tok, token_vocab = tokenizer_json()
    for name, spec in MODELS.items():
        out = os.path.join(root, name)
        config = getattr(transformers, spec["cfg"])(
            vocab_size=token_vocab + spec["vocab_extra"], bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
            **spec["kwargs"])
        torch.manual_seed(spec["seed"])
        model = getattr(transformers, spec["cls"])(config)
        randomize(model, spec["seed"])
        model.save_pretrained(out, safe_serialization=True)
        with open(os.path.join(out, "tokenizer.json"), "w") as f:
            json.dump(tok, f, indent=2)

        # The reference comes from the directory as transformers reads it back, eager attention.
        model = load_eager(out)
        ids, mask = fixed_inputs(token_vocab)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
            generated = greedy(out, ids, mask, EOS)
            # A random model rarely emits EOS, so a second run stops on a token row 0 does emit, to
            # compare early stopping and the padding of finished rows too.
            stop = generated[0, 2].item()
            generated_stop = greedy(out, ids, mask, stop)
        save_file({"input_ids": ids, "attention_mask": mask, "logits": logits.float().contiguous(),
                   "generated": generated, "stop_token": torch.tensor([stop]), "generated_stop": generated_stop},
                  os.path.join(out, "reference.safetensors"))


def score(directory):
    model = load_eager(directory)
    token_vocab = min(model.config.vocab_size, len(SPECIALS) + len(set(ALPHABET)))
    ids, mask = fixed_inputs(token_vocab)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(directory, "tokenizer.json"))
    text_ids = torch.tensor(tokenizer(TOKENIZER_TEXT, add_special_tokens=False)["input_ids"], dtype=torch.int64)
    save_file({"input_ids": ids, "attention_mask": mask, "logits": logits.float().contiguous(),
               "tokenizer_ids": text_ids}, os.path.join(directory, "transformers_logits.safetensors"))


def main(write=write_reference, score_one=score, description=__doc__):
    """The command line of this oracle, and of tests/model/moe_oracle.py with its own two jobs."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference-dir")
    parser.add_argument("--score-dirs", nargs="*", default=[])
    args = parser.parse_args()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if args.reference_dir:
        write(args.reference_dir)
    for d in args.score_dirs:
        score_one(d)


if __name__ == "__main__":
    main()
