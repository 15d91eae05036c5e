#!/usr/bin/env python3
"""Hugging Face PEFT as the oracle for hybridflow's LoRA adapters (run by tests/model/test_lora.cpp with the
project venv's python; scripts/requirements.txt lists peft). Two commands:

  write ROOT      for each name in MODELS: ROOT/<name>/base, a random tiny model saved by transformers (with the
                  tokenizer.json hybridflow reads), and ROOT/<name>/peft_adapter, an all-linear LoRA adapter
                  made by peft with random A and B (B is zeros when peft makes it, which would test nothing),
                  saved by peft, with reference.safetensors: input_ids, attention_mask and the fp32 logits of
                  base + adapter as peft computes them.
  score BASE ADAPTER OUT
                  loads BASE with transformers and ADAPTER (written by hybridflow) with peft, and writes the same
                  inputs and the logits to OUT, and to OUT.modules.json the paths of the modules peft put
                  adapters on (as it read the adapter's target_modules / exclude_modules).
  merge BASE ADAPTER MERGED OUT
                  loads MERGED (written by `hybridflow lora merge`) with transformers alone, and BASE + ADAPTER
                  with peft merged by merge_and_unload(); writes the inputs, MERGED's logits (logits) and
                  peft's merged model's (peft_merged_logits) to OUT.

The models, inputs and base-weight scales are tests/engine/hf_oracle.py's and, for the mixture of experts,
tests/model/moe_oracle.py's, imported from there. A mixture-of-experts model's adapters are on its attention
projections (hybridflow adapts no expert yet; PEFT's all-linear would).
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
try:
    import torch
    import transformers
    import peft
    from safetensors.torch import save_file
    import hf_oracle
    import moe_oracle
except ImportError as e:  # the C++ test turns this message into its failure
    sys.exit(f"peft_oracle.py: {e} in {sys.executable}; run scripts/setup.sh to install the test venv")

MODELS = ["llama", "qwen3", "qwen3_moe"]  # names of hf_oracle.MODELS and moe_oracle.MODELS
SPECS = dict(hf_oracle.MODELS, **moe_oracle.MODELS)
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def targets(name):
    return ATTENTION if name in moe_oracle.MODELS else "all-linear"
RANK, ALPHA = 4, 12  # scaling 3: a wrong scaling is visible


def inputs_for(model):
    token_vocab = min(model.config.vocab_size, len(hf_oracle.SPECIALS) + len(set(hf_oracle.ALPHABET)))
    return hf_oracle.fixed_inputs(token_vocab)


def logits_of(model, out):
    """Writes the inputs, the logits with the adapter and base_logits with peft's adapter switched off: the
    base model's own difference between the two implementations, against which the adapter's is judged."""
    ids, mask = inputs_for(model)
    pos = hf_oracle.position_ids(mask)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        with model.disable_adapter():
            base_logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    save_file({"input_ids": ids, "attention_mask": mask, "logits": logits.float().contiguous(),
               "base_logits": base_logits.float().contiguous()}, out)


def write(root):
    tok, token_vocab = hf_oracle.tokenizer_json()
    for name in MODELS:
        spec = SPECS[name]
        base_dir = os.path.join(root, name, "base")
        config = getattr(transformers, spec["cfg"])(
            vocab_size=token_vocab + spec["vocab_extra"], bos_token_id=hf_oracle.BOS, eos_token_id=hf_oracle.EOS,
            pad_token_id=hf_oracle.PAD, **spec["kwargs"])
        torch.manual_seed(spec["seed"])
        model = getattr(transformers, spec["cls"])(config)
        hf_oracle.randomize(model, spec["seed"])
        model.save_pretrained(base_dir, safe_serialization=True)
        with open(os.path.join(base_dir, "tokenizer.json"), "w") as f:
            json.dump(tok, f, indent=2)

        model = hf_oracle.load_eager(base_dir)
        lora = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets(name), lora_dropout=0.0,
                               task_type="CAUSAL_LM")
        model = peft.get_peft_model(model, lora)
        g = torch.Generator().manual_seed(spec["seed"] + 100)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "lora_" in pname:
                    p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
        adapter_dir = os.path.join(root, name, "peft_adapter")
        model.save_pretrained(adapter_dir)
        model.eval()
        logits_of(model, os.path.join(adapter_dir, "reference.safetensors"))


def score(base_dir, adapter_dir, out):
    model = peft.PeftModel.from_pretrained(hf_oracle.load_eager(base_dir), adapter_dir).eval()
    logits_of(model, out)
    prefix = "base_model.model."
    adapted = sorted(name[len(prefix):] if name.startswith(prefix) else name
                     for name, module in model.named_modules() if hasattr(module, "lora_A") and len(module.lora_A))
    with open(out + ".modules.json", "w") as f:
        json.dump(adapted, f)


def merge(base_dir, adapter_dir, merged_dir, out):
    merged = hf_oracle.load_eager(merged_dir)
    ids, mask = inputs_for(merged)
    pos = hf_oracle.position_ids(mask)
    peft_merged = peft.PeftModel.from_pretrained(hf_oracle.load_eager(base_dir), adapter_dir).merge_and_unload().eval()
    with torch.no_grad():
        logits = merged(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        peft_logits = peft_merged(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    save_file({"input_ids": ids, "attention_mask": mask, "logits": logits.float().contiguous(),
               "peft_merged_logits": peft_logits.float().contiguous()}, out)


def main():
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "score":
        score(*sys.argv[2:])
    elif len(sys.argv) == 6 and sys.argv[1] == "merge":
        merge(*sys.argv[2:])
    else:
        sys.exit("usage: peft_oracle.py write ROOT | score BASE ADAPTER OUT | merge BASE ADAPTER MERGED OUT")


if __name__ == "__main__":
    main()
