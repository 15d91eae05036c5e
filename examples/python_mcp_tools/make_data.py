#!/usr/bin/env python3
"""Writes everything examples/grpo_python_mcp_tools.yaml trains from, into OUT (default runs/python_mcp):
the calculator example's character tokenizer and chat template (examples/calculator_tool/make_data.py), and
two kinds of question, both verl rows with agent_name "tool_agent" (both tools are offered):

  "What is 347*58?"                 the python tool: <tool_call>{"name":"python","arguments":{"code":"print(347*58)"}}</tool_call>
  "How many K17 are in stock?"      the MCP server's stock tool: {"name":"stock","arguments":{"item":"K17"}}

train.jsonl / test.jsonl (RL rows, ground truth the product or the count) and sft_tools.jsonl
(demonstrations: the question -> the call, and the question, call and result -> the answer).
"""
import importlib.util
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from stock_table import stock_table  # noqa: E402

# The calculator example's writer: its tokenizer and chat template, and its JSONL writer.
_spec = importlib.util.spec_from_file_location("calculator_data", os.path.join(HERE, "..", "calculator_tool", "make_data.py"))
calculator_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calculator_data)
write_jsonl, write_tokenizer = calculator_data.write_jsonl, calculator_data.write_tokenizer


def call_text(name, arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, separators=(",", ":")) + "</tool_call>"


def product_question(a, b):
    return f"What is {a}*{b}?", call_text("python", {"code": f"print({a}*{b})"}), f"{a * b}\n", str(a * b)


def stock_question(code, count):
    return f"How many {code} are in stock?", call_text("stock", {"item": code}), str(count), str(count)


def rl_row(q, split, index):
    text, _, _, answer = q
    return {"data_source": "python_mcp", "prompt": [{"role": "user", "content": text}], "agent_name": "tool_agent",
            "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"split": split, "index": index}}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "runs/python_mcp"
    rng = random.Random(0)
    pairs = sorted({(rng.randint(100, 999), rng.randint(10, 99)) for _ in range(1200)})
    table = sorted(stock_table().items())
    rng.shuffle(pairs)
    rng.shuffle(table)
    questions = [product_question(a, b) for a, b in pairs[:1000]] + [stock_question(c, n) for c, n in table[:1000]]
    rng.shuffle(questions)
    test, train = questions[:200], questions[200:]
    write_tokenizer(os.path.join(out, "tokenizer"))
    write_jsonl(os.path.join(out, "train.jsonl"), [rl_row(q, "train", i) for i, q in enumerate(train)])
    write_jsonl(os.path.join(out, "test.jsonl"), [rl_row(q, "test", i) for i, q in enumerate(test)])
    sft = []
    for text, call, result, answer in train[:1000]:  # the test questions stay unseen
        user = [{"role": "user", "content": text}]
        sft.append({"prompt": user, "response": call})
        sft.append({"prompt": user + [{"role": "assistant", "content": call}, {"role": "tool", "content": result}],
                    "response": answer})
    write_jsonl(os.path.join(out, "sft_tools.jsonl"), sft)
    print(f"wrote {out}: {len(train)} train, {len(test)} test questions, {len(sft)} SFT rows")


if __name__ == "__main__":
    main()
