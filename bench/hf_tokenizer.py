"""The tokenizer of a `hybridflow init` model directory for transformers-based peers (TRL)."""

import json
import os


def load_hybridflow_tokenizer(model_dir):
    """`hybridflow init` writes a character-level tokenizer.json without tokenizer_config.json: the special tokens
    come from config.json's ids, as hybridflow reads them; pad falls back to eos."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"))
    model_config = json.load(open(os.path.join(model_dir, "config.json")))
    for name in ("bos", "eos", "pad"):
        token_id = model_config.get(f"{name}_token_id")
        if token_id is not None and token_id >= 0:
            setattr(tokenizer, f"{name}_token", tokenizer.convert_ids_to_tokens(token_id))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
