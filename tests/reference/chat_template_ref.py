#!/usr/bin/env python3
"""Known answers for mpitron's chat-template renderer (data/jinja.h, data/chat_template.h): for every
template in tests/data/chat_templates/ (SOURCES.md says where each comes from) and a set of
conversations, what transformers' tokenizer.apply_chat_template(messages, tokenize=False,
add_generation_prompt=...) renders, or the error it raises (raise_exception's message).

Run from the repository root with the reference venv's python (transformers 4.x, jinja2):
    scripts/setup-reference-venv.sh
    .venv-ref/bin/python tests/reference/chat_template_ref.py [--out tests/data/ref/chat_templates.json]

The tokenizer is GPT-2's (assets/gpt2) with bos/eos/unk/pad set to <s>, </s>, <unk>, <pad>: the
template only sees those strings. Output: {"transformers", "jinja2", "special", "cases": [{"template",
"conversation", "messages", "add_generation_prompt", "kwargs", "output" | "error"}], "tokenizer",
"tokenizer_special", "tokenized": [{"template", "conversation", "messages", "text", "ids"}]} (the last: the
prompt as ids, apply_chat_template(tokenize=True) with a Llama-3-style tokenizer.json), deterministic.
"""
import argparse
import importlib.metadata as md
import json
import os

from transformers import GPT2TokenizerFast, PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATES = os.path.join(ROOT, "tests", "data", "chat_templates")
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello"}],
    "system_user": [{"role": "system", "content": "You are a helpful assistant"},
                    {"role": "user", "content": "Hello"}],
    "multi_turn": [{"role": "system", "content": "You are a helpful assistant"},
                   {"role": "user", "content": "Hello"},
                   {"role": "assistant", "content": "Hi there"},
                   {"role": "user", "content": "Who are you"},
                   {"role": "assistant", "content": "   I am an assistant   "},
                   {"role": "user", "content": "Another question"}],
    "no_system_multi": [{"role": "user", "content": "Hi, what is 2+2?"},
                        {"role": "assistant", "content": "4"},
                        {"role": "user", "content": "And 3+3?"}],
    "unicode": [{"role": "user", "content": "Grüße — 日本語 ✓ \"quoted\" 'single'\nsecond line\ttab"},
                {"role": "assistant", "content": "<think>\nreasoning here\n</think>\n\nDas ist gut ✓"},
                {"role": "user", "content": "  spaced  "}],
    "assistant_last": [{"role": "user", "content": "Hello"},
                       {"role": "assistant", "content": "Hi there"}],
    "bad_alternation": [{"role": "user", "content": "one"},
                        {"role": "user", "content": "two"}],
}
# Extra template variables some families read (transformers passes apply_chat_template's **kwargs).
KWARGS = {"qwen3.jinja": [{}, {"enable_thinking": False}]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "ref", "chat_templates.json"))
    args = ap.parse_args()
    tok = GPT2TokenizerFast(vocab_file=os.path.join(ROOT, "assets", "gpt2", "gpt2-vocab.json"),
                            merges_file=os.path.join(ROOT, "assets", "gpt2", "gpt2-merges.txt"), **SPECIAL)
    cases = []
    for name in sorted(f for f in os.listdir(TEMPLATES) if f.endswith(".jinja")):
        with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
            template = f.read()
        for conv, messages in CONVERSATIONS.items():
            for agp in (True, False):
                for kwargs in KWARGS.get(name, [{}]):
                    case = {"template": name, "conversation": conv, "messages": messages,
                            "add_generation_prompt": agp, "kwargs": kwargs}
                    try:
                        case["output"] = tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                                 add_generation_prompt=agp, **kwargs)
                    except Exception as e:  # raise_exception in the template, or a type error
                        case["error"] = f"{type(e).__name__}: {e}"
                    cases.append(case)
    # The prompt as ids: apply_chat_template(tokenize=True) with a Llama-3-style tokenizer.json (its
    # <|begin_of_text|>, <|end_of_text|>, <|eot_id|> are added tokens), which adds no special tokens.
    llama_dir = os.path.join(ROOT, "tests", "data", "ref", "llama3_style")
    llama_special = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    ltok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(llama_dir, "tokenizer.json"), **llama_special)
    tokenized = []
    for name in ("llama3.1.jinja", "qwen2.5.jinja"):
        with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
            template = f.read()
        for conv in ("user", "multi_turn", "unicode"):
            messages = CONVERSATIONS[conv]
            text = ltok.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)
            ids = ltok.apply_chat_template(messages, chat_template=template, tokenize=True, add_generation_prompt=True)
            tokenized.append({"template": name, "conversation": conv, "messages": messages, "text": text, "ids": ids})
    out = {"transformers": md.version("transformers"), "jinja2": md.version("jinja2"), "special": SPECIAL,
           "cases": cases, "tokenizer": "tests/data/ref/llama3_style/tokenizer.json", "tokenizer_special": llama_special,
           "tokenized": tokenized}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases ({sum('error' in c for c in cases)} errors) -> {args.out}")


if __name__ == "__main__":
    main()
