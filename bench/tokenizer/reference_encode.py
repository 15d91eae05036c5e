#!/usr/bin/env python3
"""The Python `tokenizers` side of bench_tokenizer: encodes the same documents, one string at a
time on one thread (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false), and prints JSON.

    reference_encode.py TOKENIZER_JSON CORPUS_JSON PASSES

CORPUS_JSON is a JSON list of strings. Prints {"passes": [seconds, ...], "tokens": n, "bytes": n,
"fnv": h, "version": "..."} where tokens is the number of ids of one pass (without special tokens)
and fnv their 64-bit FNV-1a hash (each id as 4 little-endian bytes, documents in order), computed
after the timed passes, so that the C++ side can check it produced the very same ids.
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
    h = 0xCBF29CE484222325
    for doc in docs:
        for i in tok.encode(doc, add_special_tokens=False).ids:
            for b in int(i).to_bytes(4, "little"):
                h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    total_bytes = sum(len(d.encode("utf-8")) for d in docs)
    print(json.dumps({"passes": times, "tokens": tokens, "bytes": total_bytes, "fnv": h,
                      "version": tokenizers.__version__}))


if __name__ == "__main__":
    main()
