#!/usr/bin/env python3
"""transformers as the oracle for hybridflow's chat template renderer (src/text/).

Run by tests/text/test_*.cpp with the project venv's python, once per test binary (importing
transformers is most of the cost). Reads a JSON request and writes a JSON answer:

  request:  {"jinja": [{"template": str, "context": {...}}, ...],
             "chat":  [{"tokenizer_dir": str, "messages": [...], "tools": [...] | null,
                        "add_generation_prompt": bool, "kwargs": {...},
                        "documents": [...] | null, "chat_template": str (optional: used instead of the
                        tokenizer's)}, ...]}
  answer:   {"jinja": [{"output": str} | {"error": "ExceptionType: message"}, ...], "chat": [same]}

"jinja" cases render a template with the exact jinja2 environment transformers builds for chat templates
(transformers.utils.chat_template_utils._compile_jinja_template); "chat" cases call
AutoTokenizer.from_pretrained(tokenizer_dir).apply_chat_template(messages, tokenize=False, ...).
"""
import json
import sys

try:
    from transformers import AutoTokenizer
    from transformers.utils.chat_template_utils import _compile_jinja_template
except ImportError as e:  # the C++ test turns this message into its failure
    sys.exit(f"chat_template_oracle.py: {e} in {sys.executable}; run scripts/setup.sh to install the test venv")


def outcome(render):
    try:
        return {"output": render()}
    except Exception as e:  # the C++ side checks that it fails too
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    request_path, answer_path = sys.argv[1], sys.argv[2]
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    answer = {"jinja": [], "chat": []}
    for case in request.get("jinja", []):
        answer["jinja"].append(outcome(lambda: _compile_jinja_template(case["template"]).render(**case["context"])))
    tokenizers = {}
    for case in request.get("chat", []):
        path = case["tokenizer_dir"]
        if path not in tokenizers:
            tokenizers[path] = AutoTokenizer.from_pretrained(path)
        tok = tokenizers[path]
        answer["chat"].append(outcome(lambda: tok.apply_chat_template(
            case["messages"], tools=case.get("tools"), documents=case.get("documents"), add_generation_prompt=case.get("add_generation_prompt", False),
            tokenize=False, chat_template=case.get("chat_template"), **case.get("kwargs", {}))))
    with open(answer_path, "w", encoding="utf-8") as f:
        json.dump(answer, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
