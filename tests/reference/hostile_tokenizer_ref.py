#!/usr/bin/env python3
"""What Hugging Face `tokenizers` does with the self-contradictory tokenizer.json files
that tests/apps/test_hostile_inputs.cpp feeds mpitron (issue 26, class 6).

Each variant is the committed tests/data/ref/llama3_style/tokenizer.json with one edit,
made the same way in the C++ test. Run from the repo root (needs PyPI `tokenizers`):
    python3 tests/reference/hostile_tokenizer_ref.py
Writes tests/data/ref/hostile_tokenizer_ref.json:
  {"tokenizers": version, "texts": [...],
   "base_no_ignore": ids per text (ignore_merges false),
   "dup_merge0": ids per text (ignore_merges false, merges[0] listed again at the end),
   "accepted": {variant: true/false} whether tokenizers loads it,
   "reads_otherwise": {variant: note}}
mpitron reads dup_merge0 as tokenizers does (a pair listed twice takes its last rank) and
refuses the variants tokenizers refuses or reads otherwise than they say.
"""
import copy, json
import tokenizers
from tokenizers import Tokenizer

SRC = "tests/data/ref/llama3_style/tokenizer.json"
OUT = "tests/data/ref/hostile_tokenizer_ref.json"
TEXTS = ["the theory then there that this those", "Hello world, the quick brown fox!",
         "  spaces  and\nnewlines\n", "he said he would, then he did"]


def load(j):
    try:
        return Tokenizer.from_str(json.dumps(j))
    except Exception as e:  # noqa: BLE001 - any refusal counts
        return str(e)


def ids(t):
    return [t.encode(x, add_special_tokens=False).ids for x in TEXTS]


base = json.load(open(SRC, encoding="utf-8"))
v = base["model"]["vocab"]
out = {"tokenizers": tokenizers.__version__, "texts": TEXTS, "accepted": {}, "reads_otherwise": {}}

nb = copy.deepcopy(base)
nb["model"]["ignore_merges"] = False
out["base_no_ignore"] = ids(load(nb))
dup = copy.deepcopy(nb)
dup["model"]["merges"].append(dup["model"]["merges"][0])
out["dup_merge0"] = ids(load(dup))
assert out["dup_merge0"] != out["base_no_ignore"], "the duplicate must change the ids for the test to mean anything"

# Two tokens on one id: "he" takes the id of "the".
two = copy.deepcopy(base)
two["model"]["vocab"]["he"] = v["the"]
t = load(two)
out["accepted"]["two_tokens_one_id"] = not isinstance(t, str)
out["reads_otherwise"]["two_tokens_one_id"] = "id %d decodes to %r (one of the two, by hash order)" % (
    v["the"], t.decode([v["the"]]) if not isinstance(t, str) else None)

# A fractional id.
frac = json.dumps(base).replace('"he": %d' % v["he"], '"he": %d.5' % v["he"])
try:
    Tokenizer.from_str(frac)
    out["accepted"]["id_3_5"] = True
except Exception:  # noqa: BLE001
    out["accepted"]["id_3_5"] = False

# A pre-tokenizer regex that matches the empty string.
emp = copy.deepcopy(base)
emp["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "a*"
t = load(emp)
out["accepted"]["empty_match_regex"] = not isinstance(t, str)
out["reads_otherwise"]["empty_match_regex"] = "splits every character apart: %s" % ids(t)[1]

# An added token that is a vocab token with another id.
add = copy.deepcopy(base)
add["added_tokens"].append({"id": 2001, "content": "he", "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": False})
t = load(add)
out["accepted"]["added_token_other_id"] = not isinstance(t, str)
out["reads_otherwise"]["added_token_other_id"] = "'he' encodes to %d (the vocab's id), not the listed 2001" % (
    t.token_to_id("he"))

json.dump(out, open(OUT, "w"), indent=1)
print("wrote", OUT)
