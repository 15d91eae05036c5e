#!/usr/bin/env python3
"""transformers as the oracle for tests/agent/test_trajectory.cpp: the ids of whole conversations.

request: {"cases": [{"tokenizer_dir": str, "messages": [...], "tools": [...] | null, "kwargs": {...},
                     "add_generation_prompt": bool}, ...]}
answer:  {"cases": [{"text": str, "ids": [int, ...]}, ...]}: apply_chat_template(tokenize=False), then the
         tokenizer's ids of that text without added special tokens (what apply_chat_template(tokenize=True) gives).
"""
import json
import sys

from transformers import AutoTokenizer


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        request = json.load(f)
    tokenizers = {}
    answer = {"cases": []}
    for case in request["cases"]:
        path = case["tokenizer_dir"]
        if path not in tokenizers:
            tokenizers[path] = AutoTokenizer.from_pretrained(path)
        tok = tokenizers[path]
        text = tok.apply_chat_template(case["messages"], tools=case.get("tools"), tokenize=False,
                                       add_generation_prompt=case.get("add_generation_prompt", False),
                                       **case.get("kwargs", {}))
        answer["cases"].append({"text": text, "ids": tok(text, add_special_tokens=False)["input_ids"]})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(answer, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
