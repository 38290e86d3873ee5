#!/usr/bin/env python3
"""Reference ids for tests/data/test_vocab_extra_ids.cpp: HF tokenizers' BertWordPieceTokenizer over the
test's uncased vocab with Megatron's added tokens ([BOS], [EOS], then <extra_id_0> … <extra_id_{N-1}>, as
_BertWordPieceTokenizer(vocab_extra_ids=N) adds them) as special tokens. Prints the ids of a few texts.
    python3 tests/reference/wordpiece_extra_ids_ref.py   (tokenizers 0.23)"""
import sys
from tokenizers import BertWordPieceTokenizer

vocab = sys.argv[1] if len(sys.argv) > 1 else "tests/data/ref/bert_uncased/vocab.txt"
tok = BertWordPieceTokenizer(vocab, lowercase=True)
tok.add_special_tokens(["[BOS]", "[EOS]"] + [f"<extra_id_{j}>" for j in range(100)])
print("vocab_size", tok.get_vocab_size(with_added_tokens=True))
for text in ["The cat <extra_id_0> on the <extra_id_17> mat.", "<extra_id_99><extra_id_3>x",
             "no <extra_id_100> or <extra_id_> or <Extra_id_1> here", "Hello [MASK] world <extra_id_5>"]:
    print(repr(text), tok.encode(text, add_special_tokens=False).ids)
