#!/usr/bin/python3
"""NLTK punkt's sentences for LAMBADA passages, to measure the rule-based splitter against.

Megatron's --split-sentences uses NLTK's pretrained English punkt model, which is a
download (not reachable here). This trains punkt unsupervised (PunktTrainer: it learns
abbreviations, collocations and sentence starters from raw text) on all 5153 LAMBADA
passages, then splits the first 200 and writes
  tests/data/ref/punkt_sentences.json  [{text, sentences}]
tests/data/test_sentence_splitter.cpp compares data/sentence_splitter's boundaries with
these. Needs PyPI nltk (test-time only). Run from the repo root:
  /usr/bin/python3 tests/reference/sentence_punkt_ref.py
"""
import json
import os

from nltk.tokenize.punkt import PunktSentenceTokenizer, PunktTrainer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    with open(os.path.join(ROOT, "assets", "text", "lambada_test.jsonl"), encoding="utf-8") as f:
        texts = [json.loads(l)["text"] for l in f if l.strip()]
    trainer = PunktTrainer()
    trainer.INCLUDE_ALL_COLLOCS = True
    trainer.train("\n\n".join(texts), finalize=True)
    punkt = PunktSentenceTokenizer(trainer.get_params())
    out = [{"text": t, "sentences": punkt.tokenize(t)} for t in texts[:200]]
    with open(os.path.join(ROOT, "tests", "data", "ref", "punkt_sentences.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
    print(len(out), "passages,", sum(len(o["sentences"]) for o in out), "punkt sentences")


if __name__ == "__main__":
    main()
