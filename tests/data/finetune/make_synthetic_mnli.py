#!/usr/bin/env python3
"""Writes the synthetic MNLI-format files of tests/data/finetune (deterministic; no arguments).

    python3 tests/data/finetune/make_synthetic_mnli.py    # rewrites train.tsv and dev_matched.tsv

The GLUE MNLI layout (Megatron's tasks/glue/mnli.py reads columns 0, 8, 9 and the last):
index promptID pairID genre sentence1_binary_parse sentence2_binary_parse sentence1_parse
sentence2_parse sentence1 sentence2 label1 gold_label. Every word is in the test WordPiece
vocab (tests/data/ref/bert_uncased/vocab.txt), one token per word.

The label is a rule over the words of the pair:
  contradiction  sentence2 is negated (one of: not, never, no)
  entailment     sentence2 is about sentence1's subject (not negated)
  neutral        sentence2 is about another subject (not negated)
Every word of sentence2 but the negation occurs with all three labels, and sentence1 has the
same form for every label: the negation alone gives 1/3 of the samples, the other 2/3
(entailment vs neutral) need the model to compare the two sentences' subjects. A model that
only learns the negation gets about 67 %; chance is 33 %.
"""
import os
import random

SUBJECTS = ["man", "girl", "king", "mother"]
VERBS = ["saw", "met", "left", "found", "made", "took"]
OBJECTS = ["house", "car", "book", "water", "song", "church", "room"]
PLACES = ["park", "city", "river", "school", "town", "field", "home"]
NEGATIONS = ["not", "never", "no"]
LABELS = ["contradiction", "entailment", "neutral"]


def pair(rng, label):
    subj, verb, obj, place = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(PLACES)
    s1 = f"the {subj} {verb} the {obj} in the {place} ."
    other = rng.choice([s for s in SUBJECTS if s != subj])
    if label == "contradiction":
        who = rng.choice([subj, other])  # negated: about either subject
        s2 = f"the {who} was {rng.choice(NEGATIONS)} in the {rng.choice(PLACES)} ."
    else:
        who = subj if label == "entailment" else other
        s2 = f"the {who} was there in the {rng.choice(PLACES)} ."
    return s1, s2


def write(path, n, seed):
    rng = random.Random(seed)
    header = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
              "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
    with open(path, "w") as f:
        f.write("\t".join(header) + "\n")
        for i in range(n):
            label = LABELS[i % 3] if i % 7 else rng.choice(LABELS)
            s1, s2 = pair(rng, label)
            row = [str(i), str(1000 + i), f"{1000 + i}e", "synthetic", "( x )", "( y )", "(ROOT x)", "(ROOT y)",
                   s1, s2, label, label]
            f.write("\t".join(row) + "\n")


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    write(os.path.join(here, "train.tsv"), 1200, seed=1)
    write(os.path.join(here, "dev_matched.tsv"), 300, seed=2)
