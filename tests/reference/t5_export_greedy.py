#!/usr/bin/python3
"""Greedy decoding of an mpitron T5 export with Hugging Face transformers (issue #31's "export after
training loads in transformers with the same greedy output"; tests/apps/test_pretrain_t5.cpp).

    /usr/bin/python3 tests/reference/t5_export_greedy.py DIR IDS_JSON OUT_JSON

DIR: convert_checkpoint --direction mpitron-to-hf output (config.json + model.safetensors).
IDS_JSON: {"inputs": [[encoder ids], ...], "decoder": [[decoder ids], ...], "start": decoder start id,
"eos": end id, "max_new": N}.
Writes OUT_JSON: {"outputs": [[start, generated ids...], ...], "logits": [[[V floats] per decoder position], ...]}:
T5ForConditionalGeneration.generate (greedy, num_beams 1) and the teacher-forced logits of each input with
its decoder ids, in float64 (attn_implementation "eager").
"""
import json
import sys

import torch
from transformers import T5ForConditionalGeneration


def main():
    src, ids_path, out_path = sys.argv[1:4]
    with open(ids_path) as f:
        req = json.load(f)
    model = T5ForConditionalGeneration.from_pretrained(src, attn_implementation="eager").double().eval()
    outs, logits = [], []
    with torch.no_grad():
        for ids, dec in zip(req["inputs"], req["decoder"]):
            out = model(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([dec]))
            logits.append([[float(v) for v in row] for row in out.logits[0].tolist()])
        for ids in req["inputs"]:
            x = torch.tensor([ids], dtype=torch.long)
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=req["max_new"], do_sample=False,
                               num_beams=1, decoder_start_token_id=req["start"], eos_token_id=req["eos"],
                               pad_token_id=0)
            outs.append([int(t) for t in y[0].tolist()])
    with open(out_path, "w") as f:
        json.dump({"outputs": outs, "logits": logits}, f)


if __name__ == "__main__":
    main()
