#!/usr/bin/env python3
"""Known answers for mpitron's Hugging Face import/export of more families: Llama 3 (with its llama3
RoPE scaling, and the linear, dynamic-NTK and YaRN variants), Qwen3, Qwen3-MoE, Gemma 2, Gemma 3 (with
the linear rope scaling of its 4B+ configs), OLMo 2, Phi-3 and Phi-4-mini (families: llama3,
llama3_linear, llama3_dynamic, llama3_yarn, qwen3, qwen3_moe, gemma2, gemma3, olmo2, phi3, phi4_mini). For each, a small random model built and saved by Hugging Face
transformers itself from the family's PUBLISHED config.json (transcribed below with the hub repo it
comes from; only the sizes are shrunk, and every other change is listed beside it), and its logits,
loss, parameter gradients and greedy decoding computed by transformers in float64.

Run from the repository root with the reference venv's python (PyPI torch + transformers 4.57):
    scripts/setup-reference-venv.sh               # MPITRON_REF_VENV=/path to share one venv
    .venv-ref/bin/python tests/reference/hf_family2_ref.py --family F|all [--out DIR]

Writes tests/apps/ref/hf_<F>/ (deterministic: a second run is byte-identical):
  config.json, generation_config.json, model.safetensors   save_pretrained, float32, one file;
  config.json, generation_config.json, model.safetensors.index.json, model-0000k-of-0000n.safetensors
                                   SHARDED for qwen3_moe (max_shard_size 60KB).
  ref.json
    "family", "hub", "changes", "transformers", "torch"  where it comes from and what was changed;
    "batches": for two token batches (2, 24) and (1, 11): "ids", "targets" (the next tokens),
      "logits" (B, T, 100) float64 and "loss" (mean cross-entropy over all B·T positions, the
      language-model loss only); batch 0 also "grads": per HF parameter the norm, rms and 12 sampled
      entries [flat index, value] of d loss / d param (exact zeros where autograd reaches nothing).
      Tied families list model.embed_tokens.weight only (lm_head.weight is the same tensor). Where
      the config has a pad_token_id, model.embed_tokens.weight's entry also has "padding_idx",
      "pad_row_norm", "norm_without_pad_row" and "pad_in_inputs" (see the notes: transformers'
      embedding gives the pad row no gradient from the lookup).
    qwen3_moe, every batch also (L = 2 layers, E = 4 experts, k = 2, N = B·T tokens), as
      hf_family_ref.py's MoE families: "router_logits" [L][N][E]; "topk" [L][N][k] (top-k of a float32
      softmax of the router logits, in transformers' order); "aux_loss_hf" (the model's own
      aux_loss: load_balancing_loss_func over all layers' router logits CONCATENATED, without
      router_aux_loss_coef); "aux_per_layer" [L] (the same function on one layer alone); batch 0
      "aux_grads" (as "grads", for d Σ_l aux_per_layer[l] / d param).
    "rope": what transformers' rotary module holds: "inv_freq" (float32 values) and
      "attention_scaling" (the factor cos and sin are multiplied by); gemma3 also "local_inv_freq";
      llama3_dynamic per batch ("per_batch": the frequencies used for that batch's length).
    "greedy": for 2 prompts (lengths 5 and 9) generate(do_sample=False, max_new_tokens=12,
      use_cache=True) on a freshly loaded float64 eager model with eos/pad stopping disabled:
      "prompt", "tokens" (the 12 new tokens), "margins" (per step: top-1 minus top-2 of the step's
      float64 logits, from the same decoding done by hand on a KV cache), "cache_vs_full" (max |those
      step logits - the logits of a full, cache-free forward over the same prefix|: ~3e-7, the float32
      islands (see notes) turning last-bit differences into float32 roundings, except ~1e-2 for
      llama3_dynamic's prompt whose continuation passes 16 tokens), and
      "full_tokens" (greedy by full cache-free forwards; equal to "tokens" except where noted).
    "sensitivity": {variant: max |Δlogit| over batch 0 (and batch 1)} when one semantic is changed
      (rope scaling removed, a softcap removed, the window one wider, ...): how far a C++ test that
      gets that detail wrong lands from the reference.
    "mask": for the sliding families the number of keys the last query of batch 0 sees in each
      layer (from transformers' own mask functions).
    "notes": the semantics that matter for reimplementing, each verified in the transformers 4.57
      source (file and function named) or numerically here.

Weights: every parameter ~ N(0, 0.1), float32, seeded (norm weights 1 + N(0, 0.1); Gemma 2/3's RMSNorms,
which multiply by 1 + w, N(0, 0.1)). References: the SAVED model reloaded with
from_pretrained(dtype=float64, attn_implementation="eager") with torch's default dtype float64, one
thread, a fresh model per batch and per prompt (llama3_dynamic's rotary module keeps state). The script
checks that the reloaded float32 weights equal the built ones bit for bit and that a second reload
gives bit-identical logits.

--check-export DIR --family F: loads an mpitron export of F from DIR with F's class in float64 and
compares its logits on ref.json's batches (exit 1 above 1e-4) AND its greedy tokens for ref.json's
prompts (exit 1 on any difference), printing the max |Δlogit| and the tokens.
--compare-logits DIR OURS_JSON --family F: loads an export of a model mpitron trained and compares
transformers' logits on OURS_JSON's "ids" (B, T) with its "logits" (B·T, V) (exit 1 above 1e-4).
"""
import argparse
import json
import os
import sys

import torch
import transformers

transformers.utils.logging.disable_progress_bar()

SEED = 1357
VOCAB = 100
BATCHES = [(2, 24), (1, 11)]
PROMPTS = [5, 9]
NEW_TOKENS = 12
SAMPLES = 12
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SHARD = {"qwen3_moe": "60KB"}
MOE_FAMILIES = ("qwen3_moe",)
GEMMA_NORMS = ("gemma2", "gemma3")  # RMSNorm multiplies by (1 + w)

# ---------------------------------------------------------------------------------------------------
# The published configs, transcribed (architecture keys; _name_or_path, auto_map, torch_dtype and
# transformers_version left out), and what each reference changes. Token ids beyond the 100-token
# vocabulary are mapped into it.
# ---------------------------------------------------------------------------------------------------
HUB = {
    "llama3": ("meta-llama/Llama-3.2-1B", "LlamaConfig", "LlamaForCausalLM", dict(
        architectures=["LlamaForCausalLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=128000,
        eos_token_id=128001, head_dim=64, hidden_act="silu", hidden_size=2048, initializer_range=0.02,
        intermediate_size=8192, max_position_embeddings=131072, mlp_bias=False, model_type="llama",
        num_attention_heads=32, num_hidden_layers=16, num_key_value_heads=8, pretraining_tp=1, rms_norm_eps=1e-05,
        rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        rope_theta=500000.0, tie_word_embeddings=True, use_cache=True, vocab_size=128256)),
    "qwen3": ("Qwen/Qwen3-0.6B", "Qwen3Config", "Qwen3ForCausalLM", dict(
        architectures=["Qwen3ForCausalLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=151643,
        eos_token_id=151645, head_dim=128, hidden_act="silu", hidden_size=1024, initializer_range=0.02,
        intermediate_size=3072, max_position_embeddings=40960, max_window_layers=28, model_type="qwen3",
        num_attention_heads=16, num_hidden_layers=28, num_key_value_heads=8, rms_norm_eps=1e-06, rope_scaling=None,
        rope_theta=1000000, sliding_window=None, tie_word_embeddings=True, use_cache=True, use_sliding_window=False,
        vocab_size=151936)),
    "qwen3_moe": ("Qwen/Qwen3-30B-A3B", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        architectures=["Qwen3MoeForCausalLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=151643,
        decoder_sparse_step=1, eos_token_id=151645, head_dim=128, hidden_act="silu", hidden_size=2048,
        initializer_range=0.02, intermediate_size=6144, max_position_embeddings=40960, max_window_layers=48,
        mlp_only_layers=[], model_type="qwen3_moe", moe_intermediate_size=768, norm_topk_prob=True,
        num_attention_heads=32, num_experts=128, num_experts_per_tok=8, num_hidden_layers=48, num_key_value_heads=4,
        output_router_logits=False, rms_norm_eps=1e-06, rope_scaling=None, rope_theta=1000000.0,
        router_aux_loss_coef=0.001, sliding_window=None, tie_word_embeddings=False, use_cache=True,
        use_sliding_window=False, vocab_size=151936)),
    "gemma2": ("google/gemma-2-2b", "Gemma2Config", "Gemma2ForCausalLM", dict(
        architectures=["Gemma2ForCausalLM"], attention_bias=False, attention_dropout=0.0, attn_logit_softcapping=50.0,
        bos_token_id=2, cache_implementation="hybrid", eos_token_id=1, final_logit_softcapping=30.0, head_dim=256,
        hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", hidden_size=2304,
        initializer_range=0.02, intermediate_size=9216, max_position_embeddings=8192, model_type="gemma2",
        num_attention_heads=8, num_hidden_layers=26, num_key_value_heads=4, pad_token_id=0, query_pre_attn_scalar=256,
        rms_norm_eps=1e-06, rope_theta=10000.0, sliding_window=4096, use_cache=True, vocab_size=256000)),
    "gemma3": ("google/gemma-3-1b-it", "Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        architectures=["Gemma3ForCausalLM"], attention_bias=False, attention_dropout=0.0, attn_logit_softcapping=None,
        bos_token_id=2, cache_implementation="hybrid", eos_token_id=[1, 106], final_logit_softcapping=None,
        head_dim=256, hidden_activation="gelu_pytorch_tanh", hidden_size=1152, initializer_range=0.02,
        intermediate_size=6912, max_position_embeddings=32768, model_type="gemma3_text", num_attention_heads=4,
        num_hidden_layers=26, num_key_value_heads=1, pad_token_id=0, query_pre_attn_scalar=256, rms_norm_eps=1e-06,
        rope_local_base_freq=10000, rope_scaling=None, rope_theta=1000000, sliding_window=512,
        sliding_window_pattern=6, use_cache=True, vocab_size=262144)),
    "olmo2": ("allenai/OLMo-2-1124-7B", "Olmo2Config", "Olmo2ForCausalLM", dict(
        architectures=["Olmo2ForCausalLM"], attention_bias=False, attention_dropout=0.0, eos_token_id=100257,
        hidden_act="silu", hidden_size=4096, initializer_range=0.02, intermediate_size=11008,
        max_position_embeddings=4096, model_type="olmo2", num_attention_heads=32, num_hidden_layers=32,
        num_key_value_heads=32, pad_token_id=100277, rms_norm_eps=1e-06, rope_scaling=None, rope_theta=500000,
        tie_word_embeddings=False, use_cache=True, vocab_size=100352)),
    "phi3": ("microsoft/Phi-3-mini-4k-instruct", "Phi3Config", "Phi3ForCausalLM", dict(
        architectures=["Phi3ForCausalLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=1, embd_pdrop=0.0,
        eos_token_id=32000, hidden_act="silu", hidden_size=3072, initializer_range=0.02, intermediate_size=8192,
        max_position_embeddings=4096, model_type="phi3", num_attention_heads=32, num_hidden_layers=32,
        num_key_value_heads=32, original_max_position_embeddings=4096, pad_token_id=32000, resid_pdrop=0.0,
        rms_norm_eps=1e-05, rope_scaling=None, rope_theta=10000.0, sliding_window=2047, tie_word_embeddings=False,
        use_cache=True, vocab_size=32064)),
    # rope_scaling is {"type": "longrope", "short_factor": [48 numbers], "long_factor": [48 numbers]} on the
    # hub; this reference sets it to null (mpitron refuses longrope by name). full_attn_mod,
    # interpolate_factor and lm_head_bias are keys of Microsoft's own modelling code that transformers'
    # Phi3 ignores; they are kept as published.
    "phi4_mini": ("microsoft/Phi-4-mini-instruct", "Phi3Config", "Phi3ForCausalLM", dict(
        architectures=["Phi3ForCausalLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=199999,
        embd_pdrop=0.0, eos_token_id=199999, full_attn_mod=1, hidden_act="silu", hidden_size=3072,
        initializer_range=0.02, intermediate_size=8192, interpolate_factor=1, lm_head_bias=False,
        max_position_embeddings=131072, mlp_bias=False, model_type="phi3", num_attention_heads=24,
        num_hidden_layers=32, num_key_value_heads=8, original_max_position_embeddings=4096, pad_token_id=199999,
        partial_rotary_factor=0.75, resid_pdrop=0.0, rms_norm_eps=1e-05, rope_scaling="longrope (see above)",
        rope_theta=10000.0, sliding_window=262144, tie_word_embeddings=True, use_cache=True, vocab_size=200064)),
}
HUB["llama3_linear"] = HUB["llama3_dynamic"] = HUB["llama3_yarn"] = HUB["llama3"]

SMALL = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16)
LLAMA3 = dict(SMALL, num_key_value_heads=1, bos_token_id=1, eos_token_id=2,  # 4:1 query/kv heads as 32:8
              # wavelengths 2π/θ^(-2i/16) = 6.3, 32.4, 167, ... against 64/4 = 16 and 64/1 = 64: dimension
              # pair 0 is kept, pair 1 is smoothed, pairs 2..7 are divided by 32 (all three branches)
              rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                            "original_max_position_embeddings": 64, "rope_type": "llama3"})
GEMMA3 = dict(SMALL, num_hidden_layers=4, num_key_value_heads=1, eos_token_id=[1, 99], sliding_window=6,
              sliding_window_pattern=3, query_pre_attn_scalar=24, rope_scaling={"rope_type": "linear", "factor": 8.0})
# What each reference changes in the published config (besides the sizes).
SHRINK = {
    "llama3": (LLAMA3, "sizes (4 query heads / 1 key-value head: 4:1 as 32:8; head_dim 16, 4 * 16 = 64 != hidden "
                       "48, where the 1B has 32 * 64 = 2048 = hidden); bos/eos 1/2; rope_scaling "
                       "original_max_position_embeddings 8192 -> 64"),
    "llama3_linear": (dict(LLAMA3, rope_scaling={"rope_type": "linear", "factor": 4.0}),
                      "as llama3, rope_scaling {linear, factor 4} instead of llama3's"),
    "llama3_dynamic": (dict(LLAMA3, max_position_embeddings=16, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
                       "as llama3, rope_scaling {dynamic, factor 2} and max_position_embeddings 16 (the length "
                       "above which dynamic NTK rescales: batch 0 (24 tokens) and the greedy continuations pass it)"),
    "llama3_yarn": (dict(LLAMA3, max_position_embeddings=1024,
                         rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}),
                    "as llama3, rope_scaling {yarn, factor 4, original_max_position_embeddings 256} (beta_fast 32 / "
                    "beta_slow 1 by default; correction range dims [0, 3]: two pairs inside the ramp) and "
                    "max_position_embeddings 1024 = 4 * 256 (else transformers warns the factors disagree)"),
    "qwen3": (dict(SMALL, bos_token_id=1, eos_token_id=2, max_window_layers=2),
              "sizes (head_dim 16: 4 * 16 = 64 != hidden 48, as 16 * 128 = 2048 != 1024); bos/eos 1/2"),
    "qwen3_moe": (dict(SMALL, bos_token_id=1, eos_token_id=2, intermediate_size=80, moe_intermediate_size=24,
                       num_experts=4, num_experts_per_tok=2, max_window_layers=2, num_key_value_heads=1),
                  "sizes (4 experts, top-2, moe_intermediate_size 24; intermediate_size 80 is unused: every layer "
                  "is sparse; 4 query / 1 key-value heads, 32:4 published; head_dim 16); bos/eos 1/2"),
    "gemma2": (dict(SMALL, num_hidden_layers=4, sliding_window=6, query_pre_attn_scalar=24,
                    attn_logit_softcapping=1.0, final_logit_softcapping=3.0),
               "sizes (head_dim 16: 64 != hidden 48, as 8 * 256 = 2048 != 2304); 4 layers; sliding_window 6; "
               "query_pre_attn_scalar 24 (!= head_dim 16; the 2b has 256 = head_dim, the 9b 224 != 256); "
               "softcaps 50/30 -> 1/3 so that tanh is far from linear at these scales (the scores here are ~0.4)"),
    "gemma3": (GEMMA3, "sizes (head_dim 16, 1 key/value head as the 1B); 4 layers with sliding_window_pattern 3 "
                       "(layers 0, 1, 3 slide, 2 is global); sliding_window 6; query_pre_attn_scalar 24 (!= "
                       "head_dim 16; the 1B has 256 = head_dim, the 27B 168 != 128); eos [1, 106] -> [1, 99]; "
                       "PLUS rope_scaling {linear, factor 8} (the 4B/12B/27B text configs' value; the 1B has "
                       "null), which transformers applies to the GLOBAL layers' rope only: one model covers both"),
    "olmo2": (dict(SMALL, num_attention_heads=3, num_key_value_heads=1, eos_token_id=2, pad_token_id=1, head_dim=None),
              "sizes (3 heads: head_dim = hidden/heads = 48/3 = 16 as published, no head_dim key); "
              "num_key_value_heads 1 of 3 (the 7B is MHA) so q_norm (48) and k_norm (16) have different widths; "
              "eos/pad 2/1"),
    "phi3": (dict(SMALL, num_attention_heads=3, num_key_value_heads=3, sliding_window=7, bos_token_id=1,
                  eos_token_id=2, pad_token_id=2, head_dim=None),
             "sizes (3 heads, head_dim = hidden/heads = 16, MHA as published); sliding_window 2047 -> 7 (< the "
             "lengths here); bos/eos/pad 1/2/2 (eos = pad as published)"),
    "phi4_mini": (dict(SMALL, num_attention_heads=3, num_key_value_heads=1, bos_token_id=1, eos_token_id=1,
                       pad_token_id=1, rope_scaling=None, head_dim=None),
                  "sizes (3 query / 1 key-value heads: 3:1 as 24:8; head_dim = 48/3 = 16; rotary dims "
                  "int(16 * 0.75) = 12); rope_scaling longrope -> null; sliding_window 262144 kept (never binds); "
                  "bos/eos/pad 1"),
}
FAMILIES = sorted(SHRINK)


def config_dict(family):
    hub = dict(HUB[family][3])
    kw, _ = SHRINK[family]
    hub.update(kw)
    for k in [k for k, v in kw.items() if v is None and k == "head_dim"]:
        del hub[k]  # families without a head_dim key
    hub.pop("architectures")
    hub.pop("model_type")
    return hub


def classes(family):
    import transformers
    _, cfg, model, _ = HUB[family]
    return getattr(transformers, cfg), getattr(transformers, model)


def make_config(family, **over):
    Config, _ = classes(family)
    kw = config_dict(family)
    kw.update(over)
    return Config(**kw, attn_implementation="eager")


def build(family):
    _, Model = classes(family)
    torch.manual_seed(SEED)
    model = Model(make_config(family))
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.1
            one = name.endswith("norm.weight") and family not in GEMMA_NORMS
            p.copy_(noise + 1.0 if one else noise)
    return model.float().eval()


def load(family, d, config=None):
    """A fresh float64 eager model from d (every call: the dynamic rope keeps state between calls)."""
    _, Model = classes(family)
    kw = {"config": config} if config is not None else {}
    return Model.from_pretrained(d, attn_implementation="eager", dtype=torch.float64, **kw).eval()


def batches():
    g = torch.Generator().manual_seed(SEED + 1)
    return [torch.randint(0, VOCAB, (b, t + 1), generator=g) for b, t in BATCHES]


def prompts():
    g = torch.Generator().manual_seed(SEED + 2)
    return [torch.randint(0, VOCAB, (1, n), generator=g) for n in PROMPTS]


def stats(p, g):
    g = (torch.zeros_like(p) if g is None else g).reshape(-1)
    idx = torch.linspace(0, g.numel() - 1, SAMPLES).round().long().unique()
    return {"norm": g.norm().item(), "rms": (g.norm() / g.numel() ** 0.5).item(),
            "sample": [[int(k), g[k].item()] for k in idx]}


def logits_loss(model, seq):
    ids, tgt = seq[:, :-1], seq[:, 1:]
    logits = model(input_ids=ids, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
    return ids, tgt, logits, loss


def moe_refs(model, ids, r, with_grads):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func as lbl
    cfg = model.config
    E, k = cfg.num_experts, cfg.num_experts_per_tok
    out = model(input_ids=ids, output_router_logits=True, use_cache=False)
    router = out.router_logits
    tgt = torch.tensor(r["targets"])
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), tgt.reshape(-1))
    assert (out.logits.detach() - torch.tensor(r["logits"], dtype=torch.float64)).abs().max().item() == 0.0
    assert loss.item() == r["loss"]
    per_layer = [lbl((x,), E, k) for x in router]
    topk = [torch.topk(torch.nn.functional.softmax(x.detach(), dim=1, dtype=torch.float), k, dim=-1)[1]
            for x in router]
    r["aux_loss_hf"] = out.aux_loss.item()
    r["aux_per_layer"] = [a.item() for a in per_layer]
    r["router_logits"] = [x.detach().tolist() for x in router]
    r["topk"] = [t.tolist() for t in topk]
    if with_grads:
        names, params = zip(*model.named_parameters())
        g_lm = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        g_aux = torch.autograd.grad(sum(per_layer), params, allow_unused=True)
        r["grads"] = {n: stats(p, g) for n, p, g in zip(names, params, g_lm)}
        r["aux_grads"] = {n: stats(p, g) for n, p, g in zip(names, params, g_aux)}


def rotary_state(model):
    inner = model.model
    out = {"inv_freq": inner.rotary_emb.inv_freq.float().tolist(),
           "attention_scaling": float(inner.rotary_emb.attention_scaling)}
    if hasattr(inner, "rotary_emb_local"):
        out["local_inv_freq"] = inner.rotary_emb_local.inv_freq.float().tolist()
        out["local_attention_scaling"] = float(inner.rotary_emb_local.attention_scaling)
    return out


def greedy(family, d, prompt):
    """generate() as asked, the same decoding step by step with a KV cache in float64 (margins), and a
    cache-free replay of every step."""
    model = load(family, d)
    gc = model.generation_config
    gc.eos_token_id = gc.pad_token_id = gc.bos_token_id = None
    with torch.no_grad():
        seq = model.generate(prompt, do_sample=False, max_new_tokens=NEW_TOKENS, use_cache=True)[0].tolist()
    P = prompt.shape[1]
    new = seq[P:]
    assert len(new) == NEW_TOKENS, f"{family}: generate stopped after {len(new)} tokens"

    # The same greedy loop by hand: a prefill, then one token per call on the cache (as generate does).
    from transformers import DynamicCache
    model = load(family, d)
    steps, toks = [], []
    with torch.no_grad():
        out = model(input_ids=prompt, past_key_values=DynamicCache(config=model.config), use_cache=True)
        for i in range(NEW_TOKENS):
            lg = out.logits[0, -1]
            steps.append(lg)
            toks.append(int(torch.argmax(lg.float())))  # generate: argmax of the float32-cast logits
            if i + 1 < NEW_TOKENS:
                out = model(input_ids=torch.tensor([[toks[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    assert toks == new, f"{family}: the hand-made cached loop gives {toks}, generate {new}"

    def last_logits(prefix):  # a cache-free forward of a fresh model (fresh rotary state)
        with torch.no_grad():
            return load(family, d)(input_ids=torch.tensor([prefix]), use_cache=False).logits[0, -1]

    margins, worst = [], 0.0
    for step, lg in enumerate(steps):
        top = torch.topk(lg, 2).values
        margins.append((top[0] - top[1]).item())
        worst = max(worst, (last_logits(seq[:P + step]) - lg).abs().max().item())
    full_tokens, cur = [], prompt[0].tolist()
    for _ in range(NEW_TOKENS):
        nxt = int(torch.argmax(last_logits(cur).float()))
        full_tokens.append(nxt)
        cur = cur + [nxt]
    return {"prompt": prompt[0].tolist(), "tokens": new, "margins": margins, "cache_vs_full": worst,
            "full_tokens": full_tokens}


def variants(family):
    """Config changes (or model edits) that a wrong reimplementation would amount to."""
    v = {}
    cfg = config_dict(family)
    if family.startswith("llama3"):
        v["rope_scaling removed"] = dict(rope_scaling=None)
    if family == "llama3_yarn":
        v["yarn attention_factor 1 (no mscale)"] = dict(rope_scaling=dict(cfg["rope_scaling"], attention_factor=1.0))
    if family == "gemma2":
        v["attn_logit_softcapping removed"] = dict(attn_logit_softcapping=None)
        v["attn softcap after the mask instead of before"] = "softcap_after_mask"
        v["final_logit_softcapping removed"] = dict(final_logit_softcapping=None)
        v["scale head_dim^-0.5 instead of query_pre_attn_scalar^-0.5"] = dict(query_pre_attn_scalar=16)
    if family == "gemma3":
        v["scale head_dim^-0.5 instead of query_pre_attn_scalar^-0.5"] = dict(query_pre_attn_scalar=16)
        v["local layers with the global rope_theta"] = dict(rope_local_base_freq=cfg["rope_theta"])
        v["every layer global (layer_types all full_attention)"] = dict(
            layer_types=["full_attention"] * cfg["num_hidden_layers"])
    if family == "gemma3":
        v["rope_scaling removed"] = dict(rope_scaling=None)
        v["rope_scaling applied to the local (sliding) layers too"] = "scale_local_rope"
    if family in ("gemma2", "gemma3", "phi3"):
        v["window one key wider (W+1 keys)"] = dict(sliding_window=cfg["sliding_window"] + 1)
        v["no sliding window"] = dict(sliding_window=None) if family == "phi3" else dict(sliding_window=4096)
    if family == "phi4_mini":
        v["full rotary (partial_rotary_factor 1)"] = dict(partial_rotary_factor=1.0)
    if family == "qwen3_moe":
        v["norm_topk_prob false"] = dict(norm_topk_prob=False)
    if family in ("qwen3", "qwen3_moe", "olmo2", "gemma3"):
        v["QK-norm removed"] = "no_qk_norm"
    if family == "olmo2":
        v["QK-norm per head (as Qwen3) instead of over the full width"] = "per_head_qk_norm"
    return v


def apply_edit(model, edit):
    if edit == "scale_local_rope":
        r = model.model.rotary_emb_local
        r.inv_freq = r.original_inv_freq = r.inv_freq / model.config.rope_scaling["factor"]
        return
    if edit == "softcap_after_mask":  # the capped mask value is finite: masked keys get exp(-cap)
        import transformers.models.gemma2.modeling_gemma2 as g2
        cap = model.config.attn_logit_softcapping

        def eager(module, q, k, v, mask, dropout=0.0, scaling=None, softcap=None, **kw):
            k, v = g2.repeat_kv(k, module.num_key_value_groups), g2.repeat_kv(v, module.num_key_value_groups)
            s = torch.matmul(q, k.transpose(2, 3)) * scaling + mask[:, :, :, : k.shape[-2]]
            s = torch.tanh(s / cap) * cap
            w = torch.nn.functional.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
            return torch.matmul(w, v).transpose(1, 2).contiguous(), w
        g2.eager_attention_forward = eager  # module-wide: sensitivity() puts the original back
        return
    for layer in model.model.layers:
        a = layer.self_attn
        if edit == "no_qk_norm":
            a.q_norm, a.k_norm = torch.nn.Identity(), torch.nn.Identity()
        elif edit == "per_head_qk_norm":  # RMS over each 16-wide head, the same weights
            a.q_norm, a.k_norm = PerHeadNorm(a.q_norm), PerHeadNorm(a.k_norm)


class PerHeadNorm(torch.nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.w, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x):
        y = x.unflatten(-1, (-1, 16))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.w * y.flatten(-2)


def sensitivity(family, d, ref):
    import transformers.models.gemma2.modeling_gemma2 as g2
    eager = g2.eager_attention_forward
    out = {}
    for name, change in variants(family).items():
        deltas = []
        for b in ref["batches"]:
            if isinstance(change, str):
                m = load(family, d)
                apply_edit(m, change)
            else:
                m = load(family, d, config=make_config(family, **change))
            try:
                with torch.no_grad():
                    lg = m(input_ids=torch.tensor(b["ids"]), use_cache=False).logits
            finally:
                g2.eager_attention_forward = eager
            deltas.append((lg - torch.tensor(b["logits"], dtype=torch.float64)).abs().max().item())
        out[name] = deltas
    return out


def mask_keys(family, model, T):
    """Keys seen by the last query of a length-T sequence, per layer, from transformers' own masks."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
    cfg = model.config
    emb = torch.zeros(1, T, cfg.hidden_size, dtype=torch.float64)
    kw = dict(config=cfg, input_embeds=emb, attention_mask=None, cache_position=torch.arange(T),
              past_key_values=None, position_ids=torch.arange(T)[None])
    full = create_causal_mask(**kw)
    slide = create_sliding_window_causal_mask(**kw) if cfg.sliding_window is not None else None
    types = getattr(cfg, "layer_types", None) or (["sliding_attention" if slide is not None else "full_attention"]
                                                   * cfg.num_hidden_layers)
    res = []
    for t in types:
        m = slide if t == "sliding_attention" else full
        res.append(int((m[0, 0, -1] == 0).sum()) if m is not None else T)
    return {"layer_types": types, "keys_seen_by_last_query": res, "T": T}


NOTES_COMMON = [
    "transformers 4.57: every attention is eager_attention_forward (models/<f>/modeling_<f>.py): scores = "
    "(q @ k^T) * scaling, [+ softcap], + mask (additive, torch.finfo(dtype).min where masked), softmax in "
    "float32 (softmax(..., dtype=torch.float32).to(q.dtype)), @ v; GQA by repeat_kv (kv head j serves query "
    "heads j*g .. j*g+g-1, g = heads/kv_heads).",
    "RoPE (<F>RotaryEmbedding.forward + apply_rotary_pos_emb): the NeoX half split (rotate_half: x1 = first "
    "half, x2 = second; out = x*cos + (-x2, x1)*sin), freqs = inv_freq (float32) x position (float32) computed "
    "in float32 with autocast off, cos/sin then MULTIPLIED by attention_scaling (1 except yarn/longrope) and cast "
    "to the model dtype. The angles are float32-rounded even in a float64 model (~1e-6 relative at position 30).",
    "Float32 islands in these float64 references (each ~1e-7 relative, far inside f32 tolerances): rope angles "
    "(above); the eager softmax; every RMSNorm (x.to(float32) before the mean square; Llama-style norms then "
    "multiply w by the float32 result cast back; Gemma's (1 + w.float()) * x in float32); the MoE router softmax. "
    "Unlike 4.40, the lm_head output is NOT upcast with .float(): logits are float64.",
    "Sliding window (masking_utils.sliding_window_overlay + causal_mask_function): key j is visible to query i "
    "iff i - W < j <= i, i.e. W keys including itself (keys i-W+1 .. i); the flash path agrees "
    "(modeling_flash_attention_utils: window_size = (sliding_window - 1, sliding_window - 1)). NOTE: "
    "tests/apps/ref/hf_mistral (transformers 4.40) and mpitron's window_size (model/config.h: keys i-W .. i, "
    "W+1 keys) mean one key MORE: a 4.57-era sliding_window W is mpitron window_size W-1. The "
    "generate() cache for sliding layers (cache_utils.DynamicSlidingWindowLayer) keeps the last W-1 keys, the "
    "same W-key window.",
    "nn.Embedding(vocab, hidden, padding_idx=pad_token_id) wherever the config has a pad_token_id (gemma2, "
    "gemma3: 0; olmo2: 1; phi3: 2; phi4_mini: 1): the embedding LOOKUP gives that row no gradient (the row "
    "still embeds normally in the forward; a tied lm_head still sends it its gradient). Batch 0's inputs "
    "contain the pad id in gemma2, gemma3, olmo2 and phi4_mini, so their model.embed_tokens.weight 'grads' "
    "carry 'padding_idx', 'pad_row_norm', 'norm_without_pad_row' and 'pad_in_inputs': compare a trainer "
    "that does not zero the row with norm_without_pad_row.",
    "config.json as transformers 4.57 writes it names the weights' dtype 'dtype' (not 'torch_dtype').",
    "generate() (generation/utils.py _sample) takes the argmax over next-token logits cast to float32 "
    "(outputs.logits[:, -1, :].to(dtype=torch.float32)); 'margins' are the float64 step logits' top-1 minus top-2 (a margin below ~1e-6 would be a tie that float32 rounding decides).",
]


def notes(family):
    n = []
    if family.startswith("llama3"):
        n.append("Llama block (modeling_llama.py LlamaDecoderLayer): x += attn(input_layernorm(x)); x += "
                 "mlp(post_attention_layernorm(x)); final model.norm; mlp = down(silu(gate(x)) * up(x)); scaling "
                 "head_dim^-0.5 with head_dim from config (16; 4 * 16 != hidden 48); no biases; tied lm_head.")
    if family == "llama3":
        n.append("llama3 rope (modeling_rope_utils._compute_llama3_parameters): inv = theta^(-2i/d) (float32); "
                 "wavelen = 2*pi/inv; low_wl = orig/low_freq_factor = 64, high_wl = orig/high_freq_factor = 16; "
                 "wavelen > low_wl: inv/factor; wavelen < high_wl: inv; otherwise smooth = (orig/wavelen - "
                 "low_freq_factor)/(high_freq_factor - low_freq_factor), inv' = (1 - smooth)*inv/factor + "
                 "smooth*inv. attention_scaling 1. Independent of the sequence length; max_position_embeddings "
                 "is unused.")
    if family == "llama3_linear":
        n.append("linear rope (_compute_linear_scaling_rope_parameters): inv_freq = theta^(-2i/d) / factor for "
                 "every pair (positions divided by 4); attention_scaling 1.")
    if family == "llama3_dynamic":
        n.append("dynamic NTK rope (modeling_rope_utils.dynamic_rope_update.dynamic_frequency_update + "
                 "_compute_dynamic_ntk_parameters): on EVERY forward, seq_len = max(position_ids) + 1 (over the "
                 "whole batch; with a KV cache that is past length + new tokens); if seq_len > max_seq_len_cached "
                 "(initially max_position_embeddings = 16) the module recomputes inv_freq with base' = theta * "
                 "(factor * s / mpe - (factor - 1)) ** (d / (d - 2)), s = max(seq_len, mpe) (a 0-d tensor in the "
                 "default dtype), inv_freq = 1 / base'^(2i/d) in float32 (recorded per batch in 'rope'), "
                 "and sets max_seq_len_cached = seq_len; if seq_len < mpe and max_seq_len_cached > mpe it resets "
                 "to the original inv_freq. So a sequence of <= 16 tokens uses the plain frequencies and one of "
                 "24 tokens uses s = 24 (batch 0 here). attention_scaling 1.")
        n.append("dynamic NTK is STATEFUL: the rotary module keeps max_seq_len_cached between calls, so a forward "
                 "of length 16..23 after one of 24 reuses the s = 24 frequencies (no recompute: 'growth' only) "
                 "while one of <= 15 resets to the plain ones. These references load a fresh model per batch and per prompt.")
        n.append("dynamic NTK with generate(use_cache=True): the prefill uses s = prompt length (if > 16); every "
                 "decode step at position p has seq_len = p + 1 and, once p + 1 > 16, recomputes the "
                 "frequencies for s = p + 1 and rotates ONLY the new query/key with them; the keys already in the "
                 "cache keep the rotation of the step that wrote them. 'greedy' records this (the tokens "
                 "generate gives); 'cache_vs_full' is how far a step's logits are from a cache-free forward of the "
                 "same prefix (which re-rotates everything with s = prefix length), and 'full_tokens' the greedy "
                 "tokens of such cache-free forwards. A C++ decoder that rotates with s = current length "
                 "everywhere reproduces 'full_tokens', not 'tokens'; one that keeps stale keys reproduces "
                 "'tokens'; or refuse dynamic rope in cached generation.")
    if family == "llama3_yarn":
        n.append("yarn rope (_compute_yarn_parameters): pos_freqs = theta^(2i/d) (float32), extrapolation = "
                 "1/pos_freqs, interpolation = 1/(factor * pos_freqs); low/high = find_correction_dim(beta_fast=32 "
                 "resp. beta_slow=1) = d * ln(orig / (n_rot * 2*pi)) / (2 ln theta), truncated (rope_scaling "
                 "'truncate' defaults to true: floor(low), ceil(high)), clamped to [0, d-1] -> [0, 3] here; "
                 "ramp_i = clamp((i - low)/(high - low), 0, 1) over i < d/2; inv_i = interpolation_i * ramp_i + "
                 "extrapolation_i * (1 - ramp_i) (here pair 0 unscaled; pair 1 = 2/3 unscaled + 1/3 scaled = x0.75; "
                 "pair 2 = 1/3 + 2/3 = x0.5; pairs >= 3 / factor = x0.25). attention_factor (rope_scaling 'attention_factor' if given, else with mscale and "
                 "mscale_all_dim both set get_mscale(f, mscale)/get_mscale(f, mscale_all_dim), else 0.1 * ln(factor) "
                 "+ 1 = 1.1386 for factor 4) MULTIPLIES cos and sin, so q and k are both scaled and the scores "
                 "by attention_factor^2 (1.2965); the softmax scale stays head_dim^-0.5. 'original_max_position_"
                 "embeddings' comes from rope_scaling, else max_position_embeddings (with a warning); when both are "
                 "given and mpe/orig != factor transformers warns and uses the explicit factor. Independent of the sequence length (no dynamic yarn in 4.57).")
    if family in ("qwen3", "qwen3_moe"):
        n.append("Qwen3 attention (modeling_qwen3.py Qwen3Attention.forward): q = q_norm(q_proj(x).view(B, T, H, "
                 "head_dim)), k = k_norm(k_proj(x).view(B, T, KV, head_dim)): RMSNorm over each head's head_dim "
                 "entries with ONE weight vector of size head_dim shared by all heads (Llama-style w * x), applied "
                 "AFTER the head split and BEFORE rope; v is not normed. scaling head_dim^-0.5 (head_dim 16 from "
                 "config, 4 * 16 = 64 != hidden 48). No q/k/v biases (attention_bias false, unlike Qwen2). "
                 "Block as Llama (pre-norms). use_sliding_window false -> sliding_window None, every layer full.")
    if family == "qwen3":
        n.append("qwen3: tied lm_head; rope default theta 1e6.")
    if family == "qwen3_moe":
        n.append("Qwen3-MoE sparse block (modeling_qwen3_moe.py Qwen3MoeSparseMoeBlock.forward): router_logits = "
                 "gate(x) (no bias); p = softmax(router_logits, float32); top-k of p; norm_topk_prob true: the k "
                 "probabilities are divided by their sum (renormalised to 1, as Mixtral), then cast to the model "
                 "dtype; out = sum_k w_k * expert_k(x), expert = down(silu(gate(x)) * up(x)) of width "
                 "moe_intermediate_size. No shared expert (unlike Qwen2-MoE). Layer l is sparse iff l not in "
                 "mlp_only_layers and num_experts > 0 and (l + 1) % decoder_sparse_step == 0 (every layer here). "
                 "aux loss: load_balancing_loss_func (same file) = E * sum_e f_e * P_e over the concatenation of "
                 "all layers' router logits, f_e = (top-k choices of e)/N, P_e = mean softmax prob; the model adds "
                 "router_aux_loss_coef (0.001) * aux to the loss only when labels and output_router_logits are "
                 "given. Untied lm_head.")
    if family == "gemma2":
        n.append("Gemma2 block (modeling_gemma2.py Gemma2DecoderLayer.forward), sandwich norms: r = x; h = "
                 "input_layernorm(x); h = attn(h); h = post_attention_layernorm(h); x = r + h; r = x; h = "
                 "pre_feedforward_layernorm(x); h = mlp(h); h = post_feedforward_layernorm(h); x = r + h. Final "
                 "model.norm. Every RMSNorm is x * rsqrt(mean(x^2) + eps) * (1 + w), computed in float32.")
        n.append("Gemma2 embeddings x sqrt(hidden) (Gemma2Model.forward: normalizer = torch.tensor(hidden**0.5, "
                 "dtype=hidden dtype)); mlp = down(gelu_tanh(gate(x)) * up(x)) (hidden_activation "
                 "gelu_pytorch_tanh); tied lm_head.")
        n.append("Gemma2 scaling = query_pre_attn_scalar^-0.5 (24^-0.5 here, NOT head_dim^-0.5). Attention softcap "
                 "(eager_attention_forward): s = (q @ k^T) * scaling; s = tanh(s / cap) * cap with cap = "
                 "attn_logit_softcapping (1 here); THEN + mask; then softmax. Final softcap "
                 "(Gemma2ForCausalLM.forward): logits = tanh(lm_head(h) / 3) * 3, after the lm_head (the "
                 "'logits' here and the loss are the capped values).")
        n.append("Gemma2 layer types (Gemma2Config.__init__): layer_types default 'sliding_attention' if (i + 1) % "
                 "2 else 'full_attention': EVEN layers (0, 2) slide (window 6, W keys), odd layers (1, 3) are "
                 "global. The rope is the same (theta 1e4) in both kinds.")
    if family == "gemma3":
        n.append("Gemma3 (modeling_gemma3.py): Gemma3ForCausalLM on a Gemma3TextConfig (model_type gemma3_text); "
                 "weights model.* and lm_head (tied). Block exactly as Gemma2 (sandwich norms input_layernorm, "
                 "post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm; (1 + w) RMSNorms "
                 "in float32); embeddings x sqrt(hidden) via Gemma3TextScaledWordEmbedding (embed_scale buffer "
                 "cast to the weight dtype); mlp gelu_tanh GeGLU; no softcaps (both null in the 1B).")
        n.append("Gemma3 QK-norm (Gemma3Attention.forward): q = q_norm(q_proj(x).view(B, T, H, hd)), k = "
                 "k_norm(...): Gemma3RMSNorm ((1 + w), float32) over each head's head_dim, one weight of size "
                 "head_dim, AFTER the head split and BEFORE rope (as Qwen3, but with 1 + w). scaling = "
                 "query_pre_attn_scalar^-0.5 (24^-0.5 here).")
        n.append("Gemma3 layer types (Gemma3TextConfig.__init__): sliding_window_pattern (a hub key, read from "
                 "kwargs, default 6) gives layer_types[i] = 'sliding_attention' if (i + 1) % pattern else "
                 "'full_attention' (an explicit layer_types wins; save_pretrained writes layer_types): with pattern "
                 "3 and 4 layers, layers 0, 1, 3 slide (window 6, W keys) and layer 2 is global. save_pretrained "
                 "writes layer_types AND sliding_window_pattern AND a private '_sliding_window_pattern' into "
                 "config.json: read layer_types.")
        n.append("Gemma3 rope per layer kind (Gemma3TextModel.__init__/forward): global layers use rotary_emb "
                 "(rope_theta 1e6 WITH rope_scaling); sliding layers use rotary_emb_local, built from a copy of "
                 "the config with rope_theta = rope_local_base_freq (1e4) and rope_scaling = {'rope_type': "
                 "'default'}: the local rope is NEVER scaled.")
    if family == "gemma3":
        n.append("gemma3 here: rope_scaling {linear, factor 8} divides the GLOBAL layer's inv_freq by 8 "
                 "(attention_scaling 1); the sliding layers' local rope is unchanged. embed_scale is a buffer "
                 "made at construction in the default dtype: float64 sqrt(hidden) when loaded with dtype=float64 "
                 "(these references), float32-rounded when built in float32 (a 1e-6 logit difference).")
    if family == "olmo2":
        n.append("OLMo2 block (modeling_olmo2.py Olmo2DecoderLayer.forward): NO pre-norms: x = x + "
                 "post_attention_layernorm(attn(x)); x = x + post_feedforward_layernorm(mlp(x)); final model.norm "
                 "before the untied lm_head. RMSNorm (Olmo2RMSNorm) computes (w * x_normed_float32) then casts.")
        n.append("OLMo2 QK-norm (Olmo2Attention.forward): q = q_norm(q_proj(x)) over the FULL width "
                 "num_heads*head_dim (48 here), k = k_norm(k_proj(x)) over num_kv_heads*head_dim (16 here), "
                 "BEFORE the head split and before rope (one RMS over all heads together, not per head). "
                 "scaling head_dim^-0.5, head_dim = hidden/heads (no head_dim key). SwiGLU mlp, rope theta 5e5.")
    if family in ("phi3", "phi4_mini"):
        n.append("Phi3 (modeling_phi3.py): fused qkv_proj (out rows: [q: heads*hd | k: kv*hd | v: kv*hd]) and "
                 "gate_up_proj (out rows: [gate: I | up: I], mlp = down(up * silu(gate))); no biases; block as "
                 "Llama (pre-norms, Llama-style RMSNorm); scaling head_dim^-0.5, head_dim = hidden/heads.")
        n.append("Phi3 mask (Phi3Model.forward): create_sliding_window_causal_mask for EVERY layer whenever "
                 "config.sliding_window is not None (create_causal_mask otherwise), and eager attention applies "
                 "it (the sliding_window kwarg itself is ignored by eager_attention_forward, the mask does it).")
        n.append("Phi3Config._rope_scaling_adjustment: rope_scaling {'type': 'su'} or {'type': 'yarn'} is "
                 "RELABELLED 'longrope' (a Phi-3 'yarn' is not transformers' yarn).")
    if family == "phi3":
        n.append("phi3: sliding_window 7 (< 24): query i sees keys i-6 .. i (7 keys) in all layers. MHA, untied, "
                 "rope theta 1e4 over the whole head_dim.")
    if family == "phi4_mini":
        n.append("phi4_mini: partial_rotary_factor 0.75: rotary dim = int(head_dim * 0.75) = 12 "
                 "(_compute_default_rope_parameters: inv_freq = theta^(-2i/12), i < 6); apply_rotary_pos_emb "
                 "rotates q[..., :12] with the half split INSIDE those 12 (pairs (j, j + 6)) and passes q[..., "
                 "12:] through. GQA 3/1, tied lm_head. rope_scaling set to null (the hub's is longrope, which "
                 "mpitron refuses by name); sliding_window 262144 makes transformers build a sliding mask that "
                 "never binds.")
    return NOTES_COMMON + n


def write(family, out):
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    model = build(family)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".safetensors") or f.endswith(".json"):
            os.remove(os.path.join(out, f))
    if family in SHARD:
        model.save_pretrained(out, max_shard_size=SHARD[family], safe_serialization=True)
        assert os.path.exists(os.path.join(out, "model.safetensors.index.json")), "expected a sharded save"
    else:
        model.save_pretrained(out, safe_serialization=True)
    mem = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.set_default_dtype(torch.float64)
    import transformers
    ref = {"family": family, "hub": HUB[family][0], "changes": SHRINK[family][1],
           "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0], "batches": []}

    # Sanity: the saved float32 weights are the built ones, and a reload gives identical logits.
    ref_model = load(family, out)
    for n, p in ref_model.named_parameters():
        assert torch.equal(p.detach(), mem[n].double()), f"{family}: {n} differs after the reload"
    mem_model = model.double()
    for i, seq in enumerate(batches()):
        m = load(family, out)
        m.zero_grad()
        ids, tgt, logits, loss = logits_loss(m, seq)
        with torch.no_grad():
            again = load(family, out)(input_ids=ids, use_cache=False).logits
            direct = mem_model(input_ids=ids, use_cache=False).logits
        assert torch.equal(again, logits.detach()), f"{family}: a second from_pretrained gives other logits"
        r = {"ids": ids.tolist(), "targets": tgt.tolist(), "logits": logits.tolist(), "loss": loss.item()}
        print(f"  batch {i}: loss {loss.item():.6f}; the in-memory model (float32 built, .double()) differs from "
              f"the reload by {(direct - logits).abs().max().item():.3g}")
        if family in MOE_FAMILIES:
            moe_refs(m, ids, r, with_grads=i == 0)
        elif i == 0:
            loss.backward()
            r["grads"] = {name: stats(p, p.grad) for name, p in m.named_parameters()}
            pad = m.config.pad_token_id
            if pad is not None:  # nn.Embedding(padding_idx=pad): the lookup gives that row no gradient
                g = m.model.embed_tokens.weight.grad
                r["grads"]["model.embed_tokens.weight"].update(
                    padding_idx=pad, pad_row_norm=g[pad].norm().item(),
                    norm_without_pad_row=torch.cat([g[:pad], g[pad + 1:]]).norm().item(),
                    pad_in_inputs=bool((ids == pad).any()))
        if family == "llama3_dynamic":
            ref.setdefault("rope", {"per_batch": []})["per_batch"].append(dict(rotary_state(m), seq_len=ids.shape[1]))
        ref["batches"].append(r)
    if family != "llama3_dynamic":
        ref["rope"] = rotary_state(load(family, out))
    ref["greedy"] = [greedy(family, out, p) for p in prompts()]
    ref["sensitivity"] = sensitivity(family, out, ref)
    cfg = load(family, out).config
    if getattr(cfg, "sliding_window", None) is not None:
        ref["mask"] = mask_keys(family, load(family, out), BATCHES[0][1])
    ref["notes"] = notes(family)
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {out}: {sorted(os.listdir(out))}, {total} bytes; losses {[b['loss'] for b in ref['batches']]}")
    for g in ref["greedy"]:
        print(f"  greedy {g['prompt']} -> {g['tokens']} (min margin {min(g['margins']):.3g}, cache vs full "
              f"{g['cache_vs_full']:.3g}{'' if g['full_tokens'] == g['tokens'] else ', cache-free: ' + str(g['full_tokens'])})")
    for k, v in ref["sensitivity"].items():
        print(f"  sensitivity: {k}: max |dlogit| {', '.join(f'{x:.3g}' for x in v)}")
    if "mask" in ref:
        print(f"  mask: {ref['mask']}")
    if "rope" in ref:
        print(f"  rope: {json.dumps(ref['rope'])[:400]}")
    return ref


def check_export(family, d, out):
    with open(os.path.join(out, "ref.json")) as f:
        ref = json.load(f)
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    _, Model = classes(family)
    with open(os.path.join(d, "config.json")) as f:
        model_type = json.load(f).get("model_type")
    _, info = Model.from_pretrained(d, attn_implementation="eager", dtype=torch.float64, output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if model_type != HUB[family][3]["model_type"] or bad:
        print(f"{d}: not a {family} export: model_type {model_type!r} (want {HUB[family][3]['model_type']!r}); {bad}")
        return 1
    worst = 0.0
    for b in ref["batches"]:
        with torch.no_grad():
            logits = load(family, d)(input_ids=torch.tensor(b["ids"]), use_cache=False).logits
        worst = max(worst, (logits - torch.tensor(b["logits"], dtype=torch.float64)).abs().max().item())
    print(f"{d}: transformers loaded the export as {Model.__name__}; max |logit - reference| = {worst:.3g}")
    ok = worst <= 1e-4
    for g in ref["greedy"]:
        model = load(family, d)
        gc = model.generation_config
        gc.eos_token_id = gc.pad_token_id = gc.bos_token_id = None
        with torch.no_grad():
            seq = model.generate(torch.tensor([g["prompt"]]), do_sample=False, max_new_tokens=len(g["tokens"]),
                                 use_cache=True)[0].tolist()
        got = seq[len(g["prompt"]):]
        same = got == g["tokens"]
        ok = ok and same
        print(f"  greedy {g['prompt']}: export {got} {'==' if same else '!='} reference {g['tokens']}")
    return 0 if ok else 1


def compare_logits(family, d, ours_file):
    with open(ours_file) as f:
        ours = json.load(f)
    torch.set_default_dtype(torch.float64)
    model = load(family, d)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(ours["ids"]), use_cache=False).logits.reshape(-1, model.config.vocab_size)
    worst = (logits - torch.tensor(ours["logits"], dtype=torch.float64)).abs().max().item()
    print(f"{d}: transformers loaded the trained export as {type(model).__name__}; max |logit - mpitron f32| = "
          f"{worst:.3g}")
    return 0 if worst <= 1e-4 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", required=True, choices=FAMILIES + ["all"])
    ap.add_argument("--out")
    ap.add_argument("--check-export", metavar="DIR")
    ap.add_argument("--compare-logits", nargs=2, metavar=("DIR", "OURS_JSON"))
    a = ap.parse_args()
    fams = FAMILIES if a.family == "all" else [a.family]
    if (a.check_export or a.compare_logits or a.out) and len(fams) != 1:
        ap.error("--check-export, --compare-logits and --out take one --family")
    out = a.out or os.path.join(ROOT, "tests/apps/ref", "hf_" + fams[0])
    if a.compare_logits:
        sys.exit(compare_logits(fams[0], *a.compare_logits))
    if a.check_export:
        sys.exit(check_export(fams[0], a.check_export, out))
    for fam in fams:
        print(f"== {fam} ({HUB[fam][0]})")
        write(fam, a.out or os.path.join(ROOT, "tests/apps/ref", "hf_" + fam))


if __name__ == "__main__":
    main()
