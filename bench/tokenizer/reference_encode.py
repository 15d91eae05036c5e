#!/usr/bin/env python3
"""The Python `tokenizers` side of bench_tokenizer: encodes the same documents, one string at a
time on one thread (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false), and prints JSON.

    reference_encode.py TOKENIZER_JSON CORPUS_JSON PASSES

CORPUS_JSON is a JSON list of strings. Prints {"passes": [seconds, ...], "tokens": n, "bytes": n,
"version": "..."} where tokens is the number of ids of one pass (without special tokens).
"""
import json
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def main():
    path, corpus_path, passes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tok = Tokenizer.from_file(path)
    with open(corpus_path, encoding="utf-8") as f:
        docs = json.load(f)
    times, tokens = [], 0
    for _ in range(passes):
        start = time.perf_counter()
        n = 0
        for doc in docs:
            n += len(tok.encode(doc, add_special_tokens=False).ids)
        times.append(time.perf_counter() - start)
        tokens = n
    total_bytes = sum(len(d.encode("utf-8")) for d in docs)
    print(json.dumps({"passes": times, "tokens": tokens, "bytes": total_bytes, "version": tokenizers.__version__}))


if __name__ == "__main__":
    main()
