#!/usr/bin/env python3
"""The Hugging Face `tokenizers` library as the reference for hybridflow's text::Tokenizer.

Run by the tests in tests/text/ with the project venv's python, once per test program:

    tokenizers_oracle.py REQUEST.json RESPONSE.json

REQUEST: {"jobs": [{"name": str, "tokenizer": path to tokenizer.json, "texts": [str],
                    "pairs": [[str, str]], "decode_ids": [[int]]}]}
RESPONSE: {"versions": {...}, "jobs": {name: {"texts": [{"ids", "ids_plain", "tokens",
           "decoded", "decoded_skip", "normalized", "pre_tokens"}], "pairs": [{"ids", "ids_plain"}],
           "decoded_ids": [{"skip", "keep"}], "vocab_size": int}}}
where ids = encode(text) with special tokens, ids_plain without, decoded = decode(ids_plain,
skip_special_tokens=False), decoded_skip = decode(ids, skip_special_tokens=True), normalized and
pre_tokens = the normalizer's and pre-tokenizer's output on the text (null when there is none).
Everything is encoded one string at a time, single-threaded.
"""
import json
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

try:
    import tokenizers
    from tokenizers import Tokenizer
except ImportError as e:  # the C++ test turns this message into its failure
    print(f"tokenizers_oracle: cannot import tokenizers ({e}); run scripts/setup.sh", file=sys.stderr)
    sys.exit(3)


def run_job(job):
    tok = Tokenizer.from_file(job["tokenizer"])
    out = {"texts": [], "pairs": [], "decoded_ids": [], "vocab_size": tok.get_vocab_size(with_added_tokens=True)}
    for text in job.get("texts", []):
        with_special = tok.encode(text, add_special_tokens=True)
        plain = tok.encode(text, add_special_tokens=False)
        normalized = tok.normalizer.normalize_str(text) if tok.normalizer is not None else None
        pre_tokens = None
        if tok.pre_tokenizer is not None:
            pre_tokens = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
        out["texts"].append({
            "ids": with_special.ids,
            "ids_plain": plain.ids,
            "tokens": plain.tokens,
            "decoded": tok.decode(plain.ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(with_special.ids, skip_special_tokens=True),
            "normalized": normalized,
            "pre_tokens": pre_tokens,
        })
    for first, second in job.get("pairs", []):
        out["pairs"].append({
            "ids": tok.encode(first, second, add_special_tokens=True).ids,
            "ids_plain": tok.encode(first, second, add_special_tokens=False).ids,
        })
    for ids in job.get("decode_ids", []):
        out["decoded_ids"].append({
            "skip": tok.decode(ids, skip_special_tokens=True),
            "keep": tok.decode(ids, skip_special_tokens=False),
        })
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        request = json.load(f)
    response = {"versions": {"tokenizers": tokenizers.__version__}, "jobs": {}}
    for job in request["jobs"]:
        try:
            response["jobs"][job["name"]] = run_job(job)
        except Exception as e:  # name the job: one request holds many tokenizers
            print(f"tokenizers_oracle: job {job['name']!r} ({job['tokenizer']}): {e!r}", file=sys.stderr)
            return 1
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(response, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
