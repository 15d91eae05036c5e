#!/usr/bin/env python3
"""The calculator tool of examples/grpo_calculator_tool.yaml: a command tool (docs/agentic.md) that reads
its arguments as one JSON object on stdin, {"expression": "347*58"}, and prints the exact value. Only
integers, + - * // % ** and parentheses are evaluated; anything else is an error the model sees."""
import ast
import json
import sys

OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
       ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b, ast.Pow: lambda a, b: a ** b}


def value(node):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        left, right = value(node.left), value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return OPS[type(node.op)](left, right)
    raise ValueError("unsupported expression")


def main():
    args = json.loads(sys.stdin.readline())
    expression = args["expression"]
    if len(expression) > 200:
        raise ValueError("expression too long")
    print(value(ast.parse(expression, mode="eval").body))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the message is the tool's error result; a non-zero exit marks it failed
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
