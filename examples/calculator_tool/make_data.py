#!/usr/bin/env python3
"""Writes everything examples/grpo_calculator_tool.yaml trains from, into OUT (default runs/calculator):

  tokenizer/     a character-level tokenizer (tokenizer.json) with a Qwen-style chat template in
                 tokenizer_config.json: turns are <|im_start|>ROLE\\n...<|im_end|>\\n, calls are Hermes
                 <tool_call>{...}</tool_call>; `hybridflow init --tokenizer` makes a model over it
  train.jsonl, test.jsonl
                 verl rows: "What is 347*58?" as a user message, reward_model.ground_truth the product,
                 agent_name "tool_agent" (the calculator is offered); test_no_tools.jsonl: the same test
                 questions without agent_name (one plain turn, no tool)
  sft_tools.jsonl
                 tool-use demonstrations as SFT rows: the question -> the calculator call, and the question,
                 the call and its result -> the answer
  sft_direct.jsonl
                 the baseline without tools: the question -> the answer

Multiplying a 3-digit by a 2-digit number is beyond a model of a few hundred thousand parameters trained
for minutes; copying the operands into a call and the result into the answer is not.
"""
import json
import os
import random
import sys

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>"]  # added tokens, not special: they are part of the text
CHARS = ["\n"] + [chr(c) for c in range(32, 127)] + ["<unk>"]

TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.role == 'assistant' and message.tool_calls %}{{ message.content }}"
    "{% for call in message.tool_calls %}<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}"
    "{% else %}{{ message.content }}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tokenizer(out):
    os.makedirs(out, exist_ok=True)
    tokens = SPECIAL + TOOL_TAGS + CHARS
    vocab = {t: i for i, t in enumerate(tokens)}
    added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": t in SPECIAL} for t in SPECIAL + TOOL_TAGS]
    tokenizer = {"version": "1.0", "added_tokens": added, "normalizer": None, "pre_tokenizer": None,
                 "post_processor": None, "decoder": {"type": "Fuse"},
                 "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                           "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                           "vocab": vocab, "merges": []}}
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, indent=1)
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": "<unk>",
              "model_max_length": 1024, "chat_template": TEMPLATE}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)


def call_text(a, b):
    return '<tool_call>' + json.dumps({"name": "calculator", "arguments": {"expression": f"{a}*{b}"}},
                                      separators=(",", ":")) + '</tool_call>'


def question(a, b):
    return [{"role": "user", "content": f"What is {a}*{b}?"}]


def rl_row(a, b, split, index, tools=True):
    row = {"data_source": "calculator", "prompt": question(a, b),
           "reward_model": {"style": "rule", "ground_truth": str(a * b)},
           "extra_info": {"split": split, "index": index}}
    if tools:
        row["agent_name"] = "tool_agent"
    return row


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "runs/calculator"
    rng = random.Random(0)
    pairs = set()
    while len(pairs) < 2200:
        pairs.add((rng.randint(100, 999), rng.randint(10, 99)))
    pairs = sorted(pairs)
    rng.shuffle(pairs)
    test, train = pairs[:200], pairs[200:]
    demos = train[:1000]  # demonstrations of training questions; the test questions stay unseen
    write_tokenizer(os.path.join(out, "tokenizer"))
    write_jsonl(os.path.join(out, "train.jsonl"), [rl_row(a, b, "train", i) for i, (a, b) in enumerate(train)])
    write_jsonl(os.path.join(out, "test.jsonl"), [rl_row(a, b, "test", i) for i, (a, b) in enumerate(test)])
    write_jsonl(os.path.join(out, "test_no_tools.jsonl"),
                [rl_row(a, b, "test", i, tools=False) for i, (a, b) in enumerate(test)])
    sft = []
    for a, b in demos:
        sft.append({"prompt": question(a, b), "response": call_text(a, b)})
        sft.append({"prompt": question(a, b) + [{"role": "assistant", "content": call_text(a, b)},
                                                {"role": "tool", "content": str(a * b)}],
                    "response": str(a * b)})
    write_jsonl(os.path.join(out, "sft_tools.jsonl"), sft)
    write_jsonl(os.path.join(out, "sft_direct.jsonl"),
                [{"prompt": question(a, b), "response": str(a * b)} for a, b in demos])
    print(f"wrote {out}: {len(train)} train, {len(test)} test questions, {len(sft)} SFT rows from {len(demos)} demos")


if __name__ == "__main__":
    main()
