#!/usr/bin/env python3
"""Known answers for mpitron's DeepSeek-V3 family (issue 42: multi-latent attention, group-limited
sigmoid routing with a score-correction bias, YaRN rope with mscale, multi-token prediction), from
Hugging Face transformers and Megatron-Core, in the style of hf_family2_ref.py.

Two small random DeepseekV3ForCausalLM models, built and saved by transformers itself from the
PUBLISHED config.json of deepseek-ai/DeepSeek-V3 (transcribed below; only sizes shrunk, every other
change listed beside it):
  deepseek_v3          q_lora_rank 24 (q_a_proj -> q_a_layernorm -> q_b_proj)
  deepseek_v3_noqlora  q_lora_rank null (one q_proj: Megatron's linear_q_proj)
both with 4 layers (first_k_dense_replace 2: layers 0, 1 dense, 2, 3 MoE), 8 routed experts in 4 groups,
top-2 of the best 2 groups, sigmoid scores, NONZERO e_score_correction_bias, routed_scaling_factor 2.5,
one shared expert, yarn (factor 40, mscale = mscale_all_dim = 1, original_max_position_embeddings
4096 -> 64) and num_nextn_predict_layers 1, whose weights (one MTP module) are saved in DeepSeek's own
naming as model.layers.4.* exactly as the published checkpoint stores model.layers.61.*.

Run from the repository root with the reference venv's python (PyPI torch + transformers 4.57 +
megatron-core 0.16.1):
    .venv-ref/bin/python tests/reference/hf_deepseek_ref.py --family deepseek_v3|deepseek_v3_noqlora|mcore|all

Writes (deterministic: a second run is byte-identical):
  tests/apps/ref/hf_<family>/
    config.json, generation_config.json   save_pretrained (config.json keeps num_nextn_predict_layers 1,
                                          scoring_func, topk_method: transformers stores unknown keys);
    model.safetensors.index.json, model-0000k-of-0000n.safetensors   float32, SHARDED (max_shard_size
                                          60KB, 10 shards); the MTP module model.layers.4.* (44 tensors)
                                          in shards 7-9, before model.norm and lm_head (state-dict order);
    ref.json
      "family", "hub", "changes", "transformers", "torch", "mtp_loss_scaling_factor" (0.1);
      "batches": for token batches (2, 24) and (1, 11): "ids", "targets" (next tokens), "logits"
        (B, T, 100) float64, "loss" (mean CE over all B*T positions, the language-model loss only);
        "routing": per MoE layer (2, 3): "router_logits" [N][8] (transformers computes them in float32),
        "groups" [N][2] (chosen groups, ascending), "experts" [N][2] (chosen experts, ascending),
        "weights" [N][2] (their combine weights: normalised sigmoid scores x 2.5, same order),
        "min_group_margin" / "min_expert_margin" (the smallest gap at the group cut and at the expert
        cut over all N tokens: no near-ties); N = B*T tokens in row-major (b, t) order;
        "mtp": the MTP depth-1 loss with Megatron-Core's formula ("loss", "num_tokens") on the saved
        MTP weights, and for batch 1 "logits" (1, 11, 100) of the MTP head (last position fed token 0);
        batch 0 also "grads": per HF parameter norm, rms and 12 sampled [flat index, value] of
        d loss / d param, and "mtp_grads": the same for d mtp_loss / d param (mtp_loss unscaled) over the
        MTP module's parameters (model.layers.4.*, DeepSeek names, less its embed_tokens / shared_head.head
        copies: the gradient of the shared embedding and head is under model.embed_tokens.weight and
        lm_head.weight), model.norm, the last main layer (model.layers.3.*) and model.layers.0.self_attn.*.
      "rope": inv_freq (float32 values), attention_scaling, softmax_scale, qk_head_dim.
      "greedy": 2 prompts (5, 9 tokens), generate(do_sample=False, max_new_tokens=12, use_cache=True) on
        a freshly loaded float64 eager model, eos disabled: "prompt", "tokens", "margins",
        "cache_vs_full", "full_tokens" (as hf_family2_ref.py).
      "sensitivity": {variant: [max |dlogit| batch 0, batch 1]} for one semantic changed;
      "mtp_sensitivity": {variant: [|d mtp loss| batch 0, batch 1]};
      "load": what from_pretrained reports for the saved directory (the MTP keys are 'unexpected');
      "notes": the semantics, each verified in the transformers 4.57 / megatron-core 0.16.1 source.
  tests/apps/ref/mcore_deepseek_v3/   (--family mcore; needs both hf_deepseek_v3* first; mcore_deepseek_ref.py)
    model.safetensors   the deepseek_v3 weights (float32) under Megatron-Core GPTModel names
                        (MLA + MoE + 1 MTP layer), fc1 = [gate; up] concatenated;
    weights.json        {Megatron name: {"shape", "hf": [source HF/DeepSeek names]}};
    ref.json            a Megatron-Core 0.16.1 GPTModel (MLATransformerConfig, local spec, float64
                        params, on the CPU) on those weights and batch 0/1's tokens: per-token "lm loss",
                        its mean, "mtp_1 loss" (MTPLossLoggingHelper's tracker value), batch-0 grads
                        of lm loss + MTP (Megatron's backward), the same with transformers' group
                        score rule patched in (then lm loss = ref.json's HF loss), and the notes.

Weights: every parameter ~ N(0, 0.1), float32, seeded; norm weights 1 + N(0, 0.1);
e_score_correction_bias ~ N(0, 0.1) (a persistent buffer, saved); the MTP module's embed_tokens and
shared_head.head are copies of model.embed_tokens and lm_head. References: the SAVED model reloaded
with from_pretrained(dtype=float64, attn_implementation="eager") with torch's default dtype float64,
one thread, and ONE patch to transformers (patch_float64_moe: its DeepseekV3MoE cannot run in float64,
see the notes). The script checks that the reloaded weights equal the built ones bit for bit, that a
second reload gives identical logits, that transformers' 0.0 group fill chose what a -inf fill would,
and (check_rope_convention) the rope convention stated in the notes.

--check-export DIR --family F: loads an mpitron export of F from DIR with DeepseekV3ForCausalLM in
float64, compares its logits on ref.json's batches (exit 1 above 1e-4) AND its greedy tokens (exit 1 on
any difference); if DIR also holds MTP weights (model.layers.<num_hidden_layers>.*), their MTP loss is
compared with ref.json's too (exit 1 above 1e-5 relative).
--compare-logits DIR OURS_JSON --family F: transformers' logits of an exported trained model on
OURS_JSON's "ids" (B, T) against its "logits" (B*T, V) (exit 1 above 1e-4).
"""
import argparse
import json
import os
import subprocess
import sys

import torch

SEED = 7777
VOCAB = 100
BATCHES = [(2, 24), (1, 11)]
PROMPTS = [5, 9]
NEW_TOKENS = 12
SAMPLES = 12
MTP_LAMBDA = 0.1  # Megatron-Core's default mtp_loss_scaling_factor
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SHARD = "60KB"

# ---------------------------------------------------------------------------------------------------
# deepseek-ai/DeepSeek-V3 config.json, transcribed (architecture keys; auto_map, torch_dtype,
# transformers_version left out; quantization_config {activation_scheme dynamic, fmt e4m3, quant_method
# fp8, weight_block_size [128, 128]} dropped: these weights are float32).
# ---------------------------------------------------------------------------------------------------
HUB_REPO = "deepseek-ai/DeepSeek-V3"
HUB = dict(
    architectures=["DeepseekV3ForCausalLM"], attention_bias=False, attention_dropout=0.0, aux_loss_alpha=0.001,
    bos_token_id=0, eos_token_id=1, ep_size=1, first_k_dense_replace=3, hidden_act="silu", hidden_size=7168,
    initializer_range=0.02, intermediate_size=18432, kv_lora_rank=512, max_position_embeddings=163840,
    model_type="deepseek_v3", moe_intermediate_size=2048, moe_layer_freq=1, n_group=8, n_routed_experts=256,
    n_shared_experts=1, norm_topk_prob=True, num_attention_heads=128, num_experts_per_tok=8, num_hidden_layers=61,
    num_key_value_heads=128, num_nextn_predict_layers=1, pretraining_tp=1, q_lora_rank=1536, qk_nope_head_dim=128,
    qk_rope_head_dim=64, rms_norm_eps=1e-06,
    rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                  "original_max_position_embeddings": 4096, "type": "yarn"},
    rope_theta=10000, routed_scaling_factor=2.5, scoring_func="sigmoid", seq_aux=True, tie_word_embeddings=False,
    topk_group=4, topk_method="noaux_tc", use_cache=True, v_head_dim=128, vocab_size=129280)

SMALL = dict(vocab_size=VOCAB, hidden_size=40, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=4,
             first_k_dense_replace=2, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16,
             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2,
             n_group=4, topk_group=2, max_position_embeddings=2560,
             rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                           "original_max_position_embeddings": 64, "type": "yarn"})
SIZES = ("sizes: vocab 100, hidden 40 (!= heads * v_head_dim = 48, the o_proj input), 4 layers "
         "(first_k_dense_replace 3 -> 2: layers 0, 1 dense, 2, 3 MoE), "
         "4 heads (= num_key_value_heads, MHA as published), kv_lora_rank 16, qk_nope_head_dim 16, qk_rope_head_dim 8, "
         "v_head_dim 12 (q/k head 24 != v head 12), intermediate_size 64, moe_intermediate_size 16, 8 routed "
         "experts in n_group 4 groups of 2, topk_group 2, num_experts_per_tok 2 (8 of 256 in 4 of 8 groups "
         "published), 1 shared expert; rope_scaling original_max_position_embeddings 4096 -> 64 and "
         "max_position_embeddings 163840 -> 2560 = 40 * 64 (yarn pairs: 0 kept, 1 half interpolated, 2 and 3 "
         "divided by 40, so the ramp acts at these lengths); everything else as published (routed_scaling_factor "
         "2.5, sigmoid, noaux_tc, norm_topk_prob, yarn factor 40 with mscale = mscale_all_dim = 1, rope_theta 1e4, "
         "num_nextn_predict_layers 1, bos/eos 0/1, untied)")
SHRINK = {
    "deepseek_v3": (dict(SMALL), SIZES + "; q_lora_rank 1536 -> 24"),
    "deepseek_v3_noqlora": (dict(SMALL, q_lora_rank=None),
                            SIZES + "; q_lora_rank 1536 -> null (plain q_proj, as DeepSeek-V2-Lite and Megatron's "
                                    "--q-lora-rank unset)"),
}
FAMILIES = sorted(SHRINK)
MCORE_DIR = "mcore_deepseek_v3"


def config_dict(family):
    d = dict(HUB)
    d.update(SHRINK[family][0])
    d.pop("architectures")
    d.pop("model_type")
    return d


def make_config(family, **over):
    from transformers import DeepseekV3Config
    kw = config_dict(family)
    kw.update(over)
    return DeepseekV3Config(**kw, attn_implementation="eager")


# ---------------------------------------------------------------------------------------------------
# The MTP module in DeepSeek's checkpoint layout (model.layers.{num_hidden_layers}.*): a decoder layer
# (MoE, as layer >= first_k_dense_replace) plus enorm, hnorm, eh_proj, shared_head.{norm, head} and its
# own embed_tokens (the published checkpoint stores copies of the main embedding and lm_head there).
# transformers 4.57 has no MTP module: this class only gives save_pretrained the names.
# ---------------------------------------------------------------------------------------------------
def mtp_class():
    import torch.nn as nn
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm

    class SharedHead(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.norm = DeepseekV3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    class DeepseekV3MTPLayer(DeepseekV3DecoderLayer):
        def __init__(self, cfg, layer_idx):
            super().__init__(cfg, layer_idx)
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.enorm = DeepseekV3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            self.hnorm = DeepseekV3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
            self.shared_head = SharedHead(cfg)
    return DeepseekV3MTPLayer


def build(family):
    from transformers import DeepseekV3ForCausalLM
    cfg = make_config(family)
    torch.manual_seed(SEED)
    model = DeepseekV3ForCausalLM(cfg)
    L = cfg.num_hidden_layers
    model.model.layers.append(mtp_class()(cfg, L))  # saved as model.layers.L.*; forward runs layers[:L] only
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.1
            p.copy_(noise + 1.0 if name.endswith("norm.weight") else noise)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g, dtype=torch.float32) * 0.1)
        mtp = model.model.layers[L]
        mtp.embed_tokens.weight.copy_(model.model.embed_tokens.weight)  # copies, as the published checkpoint
        mtp.shared_head.head.weight.copy_(model.lm_head.weight)
    return model.float().eval()


def quiet():
    import transformers
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    patch_float64_moe()


def patch_float64_moe():
    """transformers 4.57's DeepseekV3MoE.moe cannot run a float64 model: it accumulates the routed experts in
    zeros_like(hidden, dtype=topk_weights.dtype) = float32 (the router works in float32) and index_add_ of the
    float64 expert outputs into it raises. The one change here: that buffer takes torch.promote_types(float32,
    hidden dtype), float64 for these references and, as before, float32 for float32 and bfloat16 models."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    def moe(self, hidden_states, topk_indices, topk_weights):
        final = torch.zeros_like(hidden_states, dtype=torch.promote_types(topk_weights.dtype, hidden_states.dtype))
        expert_mask = torch.nn.functional.one_hot(topk_indices, num_classes=len(self.experts)).permute(2, 0, 1)
        for expert_idx in range(len(self.experts)):
            token_indices, weight_indices = torch.where(expert_mask[expert_idx])
            if token_indices.numel() > 0:
                expert_weights = topk_weights[token_indices, weight_indices]
                out = self.experts[expert_idx](hidden_states[token_indices]) * expert_weights.unsqueeze(-1)
                final.index_add_(0, token_indices, out)
        return final.type(hidden_states.dtype)
    ds.DeepseekV3MoE.moe = moe


def load(d, config=None, info=False):
    """A fresh float64 eager model from d."""
    from transformers import DeepseekV3ForCausalLM
    kw = {"config": config} if config is not None else {}
    return DeepseekV3ForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float64,
                                                 output_loading_info=info, **kw)


def load_model(d, config=None):
    return load(d, config).eval()


def read_weights(d):
    from safetensors.torch import load_file
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, f)))
    return out


def mtp_modules(model, d):
    """The MTP module of directory d as a float64 DeepseekV3MTPLayer (None if d has no MTP weights)."""
    cfg = model.config
    L = cfg.num_hidden_layers
    prefix = f"model.layers.{L}."
    w = {k[len(prefix):]: v for k, v in read_weights(d).items() if k.startswith(prefix)}
    if not w:
        return None
    m = mtp_class()(cfg, L).double()
    m.load_state_dict({k: v.double() for k, v in w.items()}, strict=True)
    return m.eval()


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


def causal_mask(model, x):
    from transformers.masking_utils import create_causal_mask
    T = x.shape[1]
    return create_causal_mask(config=model.config, input_embeds=x, attention_mask=None,
                              cache_position=torch.arange(T), past_key_values=None,
                              position_ids=torch.arange(T)[None])


def roll_left(t, k=1):
    """Megatron-Core's roll_tensor(shifts=-1) applied k times (CP = 1): left shift, zeros enter at the end."""
    out = t
    for _ in range(k):
        out = torch.roll(out, shifts=-1, dims=-1)
        out[..., -1] = 0
    return out


def mtp_forward(model, mtp, ids, labels, h, variant=None):
    """Megatron-Core's MTP (multi_token_prediction.py MultiTokenPredictionLayer._get_embeddings /
    _concat_embeddings / _proj_and_transformer_layer / _postprocess, gpt_model.py GPTModel._postprocess)
    in float64 on the HF weights: depth 1 of D = 1. h = the main model's final-normed hidden states.
    Returns (masked mean CE, num_tokens, logits)."""
    emb = model.model.embed_tokens
    ids1 = roll_left(ids) if variant != "embedding of token i (no shift)" else ids
    e = emb(ids1)
    if variant == "h before the final norm (model.norm)":
        h = h[1]
    elif isinstance(h, tuple):
        h = h[0]
    parts = (mtp.enorm(e), mtp.hnorm(h))
    if variant == "concat order [hnorm(h); enorm(e)]":
        parts = parts[::-1]
    x = mtp.eh_proj(torch.cat(parts, dim=-1))
    pos = torch.arange(ids.shape[1])[None]
    x = mtp(x, attention_mask=causal_mask(model, x), position_ids=pos,
            position_embeddings=model.model.rotary_emb(x, pos))
    if variant != "no MTP output norm (shared_head.norm skipped)":
        x = mtp.shared_head.norm(x)
    logits = model.lm_head(x)
    lab = roll_left(labels) if variant != "depth-1 labels = the main labels (shift 1, not 2)" else labels
    mask = roll_left(torch.ones_like(labels, dtype=torch.float64))
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab.reshape(-1), reduction="none")
    n = mask.sum()
    return (ce * mask.reshape(-1)).sum() / n, int(n.item()), logits


def hidden_pair(model, ids):
    """(final-normed last hidden state, the same before model.norm)."""
    store = {}
    hook = model.model.norm.register_forward_hook(lambda m, i, o: store.__setitem__("pre", i[0]))
    try:
        out = model.model(input_ids=ids, use_cache=False)
    finally:
        hook.remove()
    return out.last_hidden_state, store["pre"]


# ---------------------------------------------------------------------------------------------------
# Routing capture
# ---------------------------------------------------------------------------------------------------
def routing_refs(model, ids):
    """Per MoE layer: router logits, chosen groups / experts / weights, and the cut margins."""
    gates = {i: l.mlp.gate for i, l in enumerate(model.model.layers[: model.config.num_hidden_layers])
             if hasattr(l.mlp, "gate")}
    seen = {}
    hooks = [g.register_forward_hook(lambda m, i, o, k=k: seen.__setitem__(k, (i[0].detach(), o)))
             for k, g in gates.items()]
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    out = {}
    for k, (x, (idx, w)) in sorted(seen.items()):
        g = gates[k]
        x = x.reshape(-1, x.shape[-1])
        logits = torch.nn.functional.linear(x.float(), g.weight.float())
        scores = logits.sigmoid()
        sfc = scores + g.e_score_correction_bias
        E, G = g.n_routed_experts, g.n_group
        gs = sfc.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
        gsort = gs.sort(dim=-1, descending=True)
        groups = gsort.indices[:, : g.topk_group].sort(dim=-1).values
        gmask = torch.zeros_like(gs).scatter(1, groups, 1).bool()
        allowed = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        masked = sfc.masked_fill(~allowed, float("-inf"))
        esort = masked.sort(dim=-1, descending=True)
        experts = esort.indices[:, : g.top_k].sort(dim=-1).values
        # transformers' rule (0.0 fill, not -inf) chose the same experts for every token here:
        assert torch.equal(idx.sort(dim=-1).values, experts), f"layer {k}: the 0.0 fill changed a choice"
        order = idx.sort(dim=-1)
        weights = w.gather(1, order.indices)
        out[str(k)] = {
            "router_logits": logits.tolist(), "groups": groups.tolist(), "experts": experts.tolist(),
            "weights": weights.tolist(),
            "min_group_margin": (gsort.values[:, g.topk_group - 1] - gsort.values[:, g.topk_group]).min().item(),
            "min_expert_margin": (esort.values[:, g.top_k - 1] - esort.values[:, g.top_k]).min().item()}
    return out


def check_rope_convention(model):
    """transformers' interleave path = the complex (pairwise) rotation of the stored order, then the permutation
    [0, 2, 4, .., 1, 3, 5, ..] (asserted on random q, k with this model's frequencies)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave
    g = torch.Generator().manual_seed(SEED + 3)
    d, T = model.config.qk_rope_head_dim, 30
    q, k = torch.randn(1, 2, T, d, generator=g), torch.randn(1, 1, T, d, generator=g)
    pos = torch.arange(T)[None]
    cos, sin = model.model.rotary_emb(q, pos)
    qe, ke = apply_rotary_pos_emb_interleave(q, k, cos, sin)
    rot = torch.complex(cos[0, :, : d // 2], sin[0, :, : d // 2])  # e^(i pos inv_freq_j), j < d/2

    def pairwise(x):
        c = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
        return torch.view_as_real(c * rot).reshape(x.shape)
    perm = list(range(0, d, 2)) + list(range(1, d, 2))
    assert (qe - pairwise(q)[..., perm]).abs().max() < 1e-12 and (ke - pairwise(k)[..., perm]).abs().max() < 1e-12


def rope_state(model):
    r = model.model.rotary_emb
    return {"inv_freq": r.inv_freq.float().tolist(), "attention_scaling": float(r.attention_scaling),
            "softmax_scale": float(model.model.layers[0].self_attn.scaling),
            "qk_head_dim": model.config.qk_head_dim}


def greedy(d, prompt):
    """generate() as asked, the same decoding by hand on a KV cache (margins), a cache-free replay."""
    model = load_model(d)
    gc = model.generation_config
    gc.eos_token_id = gc.pad_token_id = gc.bos_token_id = None
    with torch.no_grad():
        seq = model.generate(prompt, do_sample=False, max_new_tokens=NEW_TOKENS, use_cache=True)[0].tolist()
    P = prompt.shape[1]
    new = seq[P:]
    assert len(new) == NEW_TOKENS
    from transformers import DynamicCache
    model = load_model(d)
    steps, toks = [], []
    with torch.no_grad():
        out = model(input_ids=prompt, past_key_values=DynamicCache(config=model.config), use_cache=True)
        for i in range(NEW_TOKENS):
            lg = out.logits[0, -1]
            steps.append(lg)
            toks.append(int(torch.argmax(lg.float())))
            if i + 1 < NEW_TOKENS:
                out = model(input_ids=torch.tensor([[toks[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    assert toks == new, f"the hand-made cached loop gives {toks}, generate {new}"

    def last_logits(prefix):
        with torch.no_grad():
            return model(input_ids=torch.tensor([prefix]), use_cache=False).logits[0, -1]

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


# ---------------------------------------------------------------------------------------------------
# Sensitivity: one semantic changed at a time
# ---------------------------------------------------------------------------------------------------
def _topk_group_max(self, scores):  # group score = the max of each group (Megatron's top-(k/topk_group) = top-1)
    sfc = scores.view(-1, self.n_routed_experts) + self.e_score_correction_bias.unsqueeze(0)
    gs = sfc.view(-1, self.n_group, self.n_routed_experts // self.n_group).max(dim=-1).values
    return _finish(self, sfc, gs, 0.0)


def _topk_neg_inf(self, scores):  # DeepSeek's / Megatron's -inf fill instead of transformers' 0.0
    sfc = scores.view(-1, self.n_routed_experts) + self.e_score_correction_bias.unsqueeze(0)
    gs = sfc.view(-1, self.n_group, self.n_routed_experts // self.n_group).topk(2, dim=-1)[0].sum(-1)
    return _finish(self, sfc, gs, float("-inf"))


def _finish(self, sfc, gs, fill):
    group_idx = torch.topk(gs, k=self.topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(gs).scatter_(1, group_idx, 1)
    sm = mask.unsqueeze(-1).expand(-1, self.n_group, self.n_routed_experts // self.n_group).reshape(
        -1, self.n_routed_experts)
    return torch.topk(sfc.masked_fill(~sm.bool(), fill), k=self.top_k, dim=-1, sorted=False)[1]


def _router_bias_in_weights(self, hidden_states):
    import torch.nn.functional as F
    hidden_states = hidden_states.view(-1, self.config.hidden_size)
    scores = F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32)).sigmoid()
    idx = self.get_topk_indices(scores)
    w = (scores + self.e_score_correction_bias).gather(1, idx)
    w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return idx, w * self.routed_scaling_factor


class _Zero(torch.nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)


def variants(family):
    v = {
        "e_score_correction_bias zero (choice without the bias)": "no_bias",
        "no group limit (n_group 1, topk_group 1)": "no_groups",
        "group score = max of each group (Megatron's sum of top-(k/topk_group) = top-1 here) instead of the sum "
        "of its top 2": "group_max",
        "bias also in the combine weights": "bias_in_weights",
        "routed_scaling_factor 1": "rsf1",
        "norm_topk_prob false": "no_norm",
        "shared expert dropped": "no_shared",
        "softmax scale qk_head_dim^-1/2 (yarn mscale(40, mscale_all_dim)^2 = 1.874 ignored)": "no_mscale",
        "rope_scaling removed (plain rope, no mscale)": dict(rope_scaling=None),
        "plain rope frequencies (yarn's interpolation ignored), mscale kept": "plain_freqs",
        "rotate-half rope on the stored order (rope_interleave false)": dict(rope_interleave=False),
        "kv_a_layernorm skipped": "no_kv_norm",
        "transformers' 0.0 fill of the masked groups -> -inf (DeepSeek's and Megatron's)": "neg_inf",
    }
    if SHRINK[family][0]["q_lora_rank"] is not None:
        v["q_lora off: q = q_b_proj(q_a_proj(x)), q_a_layernorm skipped"] = "no_q_norm"
    return v


def apply_edit(model, edit):
    import types
    if edit == "plain_freqs":
        r, d = model.model.rotary_emb, model.config.qk_rope_head_dim
        r.inv_freq = r.original_inv_freq = 1.0 / (model.config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64)
                                                                              .float() / d))
        return
    for layer in model.model.layers:
        a, mlp = layer.self_attn, layer.mlp
        gate = getattr(mlp, "gate", None)
        if edit == "no_mscale":
            a.scaling = a.qk_head_dim ** -0.5
        elif edit == "no_kv_norm":
            a.kv_a_layernorm = torch.nn.Identity()
        elif edit == "no_q_norm":
            a.q_a_layernorm = torch.nn.Identity()
        elif gate is not None:
            if edit == "no_bias":
                gate.e_score_correction_bias.zero_()
            elif edit == "no_groups":
                gate.n_group = gate.topk_group = 1
            elif edit == "group_max":
                gate.get_topk_indices = types.MethodType(_topk_group_max, gate)
            elif edit == "neg_inf":
                gate.get_topk_indices = types.MethodType(_topk_neg_inf, gate)
            elif edit == "bias_in_weights":
                gate.forward = types.MethodType(_router_bias_in_weights, gate)
            elif edit == "rsf1":
                gate.routed_scaling_factor = 1.0
            elif edit == "no_norm":
                gate.norm_topk_prob = False
            elif edit == "no_shared":
                mlp.shared_experts = _Zero()


def sensitivity(family, d, ref):
    out = {}
    for name, change in variants(family).items():
        deltas = []
        for b in ref["batches"]:
            if isinstance(change, str):
                m = load_model(d)
                apply_edit(m, change)
            else:
                m = load_model(d, config=make_config(family, **change))
            with torch.no_grad():
                lg = m(input_ids=torch.tensor(b["ids"]), use_cache=False).logits
            deltas.append((lg - torch.tensor(b["logits"], dtype=torch.float64)).abs().max().item())
        out[name] = deltas
    return out


MTP_VARIANTS = ["concat order [hnorm(h); enorm(e)]", "h before the final norm (model.norm)",
                "no MTP output norm (shared_head.norm skipped)", "embedding of token i (no shift)",
                "depth-1 labels = the main labels (shift 1, not 2)"]


def mtp_sensitivity(d, ref):
    out = {}
    for name in MTP_VARIANTS:
        deltas = []
        for b in ref["batches"]:
            m = load_model(d)
            mtp = mtp_modules(m, d)
            ids, tgt = torch.tensor(b["ids"]), torch.tensor(b["targets"])
            with torch.no_grad():
                loss, _, _ = mtp_forward(m, mtp, ids, tgt, hidden_pair(m, ids), variant=name)
            deltas.append(abs(loss.item() - b["mtp"]["loss"]))
        out[name] = deltas
    return out


# ---------------------------------------------------------------------------------------------------
# Notes
# ---------------------------------------------------------------------------------------------------
T = "transformers/models/deepseek_v3/modeling_deepseek_v3.py"
NOTES = [
    f"MLA ({T} DeepseekV3Attention.forward), x (B, T, hidden 40), H = 4 heads: q = q_b_proj(q_a_layernorm("
    "q_a_proj(x))) (40 -> q_lora_rank 24 -> RMSNorm(24) -> H*(nope 16 + rope 8) = 96) or, with q_lora_rank null, "
    "q = q_proj(x) (40 -> 96); q.view(B, T, H, 24): per head [q_nope (16) | q_pe (8)]. kv_a_proj_with_mqa(x): 40 -> "
    "kv_lora_rank 16 + qk_rope_head_dim 8, split [c_kv (16) | k_pe (8)]; k_pe is ONE 8-wide vector per token shared "
    "by all heads (viewed (B, 1, T, 8), rotated, then expanded over heads); c_kv -> kv_a_layernorm (RMSNorm(16)) -> "
    "kv_b_proj (16 -> H*(16 + 12) = 112) viewed (B, T, H, 28): per head [k_nope (16) | v (12)]. query = [q_nope | "
    "rope(q_pe)], key = [k_nope | rope(k_pe)] (24 wide), value 12 wide; eager attention softmax(q k^T * scaling "
    "+ mask) v -> (B, T, H*12 = 48) -> o_proj (48 -> 40). The KV cache (DynamicCache) holds the full per-head "
    "key (24) and value (12), not the latent. No biases (attention_bias false). Weight layouts (out, in): q_a_proj "
    "(24, 40), q_b_proj (96, 24), q_proj (96, 40), kv_a_proj_with_mqa (24, 40), kv_b_proj (112, 16), o_proj (40, 48).",
    "Megatron-Core 0.16.1 MLA (megatron/core/transformer/multi_latent_attention.py MLASelfAttention."
    "get_query_key_value_tensors) is the same data flow under other names: linear_q_down_proj = q_a_proj, "
    "q_layernorm = q_a_layernorm (built only with --qk-layernorm, else IdentityOp), linear_q_up_proj = q_b_proj, "
    "linear_q_proj = q_proj (q_lora_rank None), linear_kv_down_proj = kv_a_proj_with_mqa (split [kv_lora_rank | "
    "qk_pos_emb_head_dim]), kv_layernorm = kv_a_layernorm, linear_kv_up_proj = kv_b_proj (per head [qk_head_dim | "
    "v_head_dim]), linear_proj = o_proj; Megatron's qk_head_dim is DeepSeek's qk_nope_head_dim and "
    "qk_pos_emb_head_dim is qk_rope_head_dim. Same weight matrices, no permutation.",
    f"RoPE on the rope part only ({T} apply_rotary_pos_emb_interleave, used because rope_interleave defaults to "
    "TRUE in DeepseekV3Config and the published config has no such key): q_pe (B, H, T, 8) and k_pe (B, 1, T, 8) "
    "are first DE-INTERLEAVED, x -> [x0, x2, x4, x6, x1, x3, x5, x7] (view (.., 4, 2).transpose), then rotated "
    "NeoX-style (rotate_half over the halves; cos/sin = cat(freqs, freqs)) and left in that permuted order. "
    "Equivalently: the INTERLEAVED (GPT-J / complex) rotation of the stored order, pairs (x_{2i}, x_{2i+1}) rotated "
    "by angle pos * inv_freq[i] (x_{2i} cos - x_{2i+1} sin, x_{2i} sin + x_{2i+1} cos), followed by the permutation "
    "[0, 2, 4, 6, 1, 3, 5, 7] that q and k share (so scores are those of the interleaved rotation; the per-head KEY "
    "cached by transformers is in the permuted order). Asserted here (check_rope_convention). Megatron-Core does the "
    "identical thing (models/common/embeddings/rope_utils.py _apply_rotary_pos_emb_bshd, multi_latent_attention "
    "branch: t = cat(t[..., 0::2], t[..., 1::2]) then rotate-half). DeepSeek's own inference code (view_as_complex "
    "on pairs) is the interleaved rotation. rope_interleave false would rotate-half the stored order (see "
    "sensitivity).",
    "YaRN (transformers/modeling_rope_utils.py _compute_yarn_parameters) over dim = head_dim = qk_rope_head_dim 8 "
    "(DeepseekV3Config sets head_dim = qk_rope_head_dim): pos_freqs = 1e4^(2i/8); find_correction_range(beta_fast "
    "32, beta_slow 1, dim 8, base 1e4, original_max_position_embeddings 64) = floor(-0.50) -> 0, ceil(1.01) = 2; "
    "ramp_i = clamp((i - 0)/(2 - 0), 0, 1) = [0, 0.5, 1, 1]; inv_freq_i = (1/pos_freqs_i)/40 * ramp_i + "
    "(1/pos_freqs_i) * (1 - ramp_i) = [1, 0.05125, 2.5e-4, 2.5e-5] ('rope'); attention_factor = "
    "get_mscale(40, mscale 1)/get_mscale(40, mscale_all_dim 1) = 1 (cos/sin unscaled; get_mscale(s, m) = 0.1 m "
    "ln s + 1). Megatron-Core's YarnRotaryEmbedding (models/common/embeddings/yarn_rotary_pos_embedding.py) gives "
    "the same inv_freq and the same factor (_yarn_get_concentration_factor). Angles computed in float32 in both.",
    f"Softmax scale ({T} DeepseekV3Attention.__init__): scaling = qk_head_dim^-1/2 (qk_head_dim = nope + rope = 24, "
    "NOT v_head_dim) times mscale^2 with mscale = yarn_get_mscale(factor 40, mscale_all_dim 1) = 0.1 ln 40 + 1 = "
    "1.36889: scaling = 24^-0.5 * 1.87386 = 0.382499 ('rope'.softmax_scale). Applied only when rope_scaling is set "
    "and mscale_all_dim is nonzero. Megatron-Core: MultiLatentAttention.__init__ softmax_scale = mscale * mscale / "
    "sqrt(q_head_dim) with mscale = _yarn_get_mscale(rotary_scaling_factor, mscale_all_dim): the same.",
    f"Router ({T} DeepseekV3TopkRouter.forward/get_topk_indices), per token, in FLOAT32 even in a float64 model: "
    "logits = x.float() @ gate.weight.float()^T (no bias); s = sigmoid(logits); c = s + e_score_correction_bias "
    "(the bias is used ONLY for the choice); group score = sum of the TOP-2 c in each group (8 experts in 4 "
    "consecutive groups of 2: experts 2g, 2g+1); keep the topk_group = 2 best groups; masked_fill the other groups' "
    "c with 0.0; top-k (k = 2) of c -> the experts. Weights = s (WITHOUT the bias) of the chosen experts, divided by "
    "their sum + 1e-20 (norm_topk_prob), times routed_scaling_factor 2.5. out = sum_k w_k * expert_k(x) "
    "+ shared_experts(x) (an MLP of width moe_intermediate_size "
    "* n_shared_experts = 16, not weighted). Experts and shared experts: down(silu(gate(x)) * up(x)).",
    "transformers' 0.0 fill vs -inf: DeepSeek's inference code and Megatron-Core fill the masked groups with -inf; "
    "transformers (and DeepSeek's HF remote code) with 0.0, which differs only if fewer than k of the allowed c are "
    "positive. Checked here: the same choice for every token of every batch (routing_refs asserts it; sensitivity "
    "'-> -inf' is 0).",
    "Group score rule, transformers vs Megatron-Core: transformers sums the top 2 of each group ALWAYS; Megatron-Core "
    "(transformer/moe/moe_utils.py group_limited_topk) sums the top (moe_router_topk // moe_router_group_topk). The "
    "two agree for DeepSeek-V3 (8 // 4 = 2) but NOT for this shrunk config (2 // 2 = 1: Megatron takes the MAX of "
    "each group); see sensitivity 'group score = max' and mcore_deepseek_v3/ref.json. An importer of a HF config "
    "must use top-2 sums; a trainer following Megatron's flags uses top-(k/groups).",
    "Megatron-Core sigmoid routing (moe_utils.topk_routing_with_score_function): scores = sigmoid(logits); with "
    "expert_bias: choice on scores + bias (group_limited_topk with -inf fill), probs = gathered scores / (sum + 1e-20) "
    "only if topk > 1 (transformers normalises for any k when norm_topk_prob), then * moe_router_topk_scaling_factor; "
    "expert_bias is a float32 buffer updated outside the forward. --moe-router-num-groups = n_group, "
    "--moe-router-group-topk = topk_group, --moe-router-topk-scaling-factor = routed_scaling_factor, "
    "--moe-router-enable-expert-bias (+ --moe-router-score-function sigmoid) = e_score_correction_bias.",
    f"Layers ({T} DeepseekV3DecoderLayer): layer l is MoE iff l >= first_k_dense_replace (2): layers 0, 1 have the "
    "dense MLP (intermediate_size 64, no router), layers 2, 3 the MoE (no moe_layer_freq in transformers; the hub key "
    "is ignored). Megatron: --moe-layer-freq [0,0,1,1] (a list; an int N means 1 if i % N == 0). Block: x += "
    "attn(input_layernorm(x)); x += mlp(post_attention_layernorm(x)); final model.norm; untied lm_head. RMSNorm "
    "(DeepseekV3RMSNorm): x.float() * rsqrt(mean(x^2) + 1e-6), cast back, times w (eps 1e-6 also for q_a_layernorm "
    "and kv_a_layernorm: they are built with the default eps).",
    "What transformers 4.57 does with the MTP weights: NOTHING. DeepseekV3ForCausalLM has no MTP module; "
    "num_nextn_predict_layers (and scoring_func, topk_method, seq_aux, aux_loss_alpha, moe_layer_freq, ep_size) are "
    "kept as plain config attributes and written back by save_pretrained. DeepseekV3Model._keys_to_ignore_on_load_"
    "unexpected = [r'model\\.layers\\.61.*'] silences the published layer 61 only; here the MTP keys model.layers.4.* "
    "load as UNEXPECTED keys (a warning, dropped; see 'load'), and save_pretrained of a loaded model drops them. "
    "The published layout, reproduced here under model.layers.4.: embed_tokens.weight (a copy of "
    "model.embed_tokens), enorm.weight, hnorm.weight, eh_proj.weight (hidden, 2*hidden), shared_head.norm.weight, "
    "shared_head.head.weight (a copy of lm_head), and a full MoE decoder layer: input_layernorm, self_attn.*, "
    "post_attention_layernorm, mlp.gate.weight, mlp.gate.e_score_correction_bias, mlp.experts.*, mlp.shared_experts.*.",
    "MTP with Megatron-Core's formula (transformer/multi_token_prediction.py, models/gpt/gpt_model.py), depth k = "
    "1..D (D = mtp_num_layers = num_nextn_predict_layers = 1), CP = 1, no packing: h_0 = the main decoder's output "
    "AFTER its final layernorm (TransformerBlock.has_final_layernorm_in_this_stage puts it on the stage of the last "
    "decoder layer when MTP is on) = the tensor the main head sees; ids_k = roll_tensor(ids_{k-1}, -1) (left shift, "
    "0 fills the last position: token id 0 is embedded there); e_k = the SHARED embedding(ids_k) (GPTModel."
    "embedding; DeepSeek's model.layers.61.embed_tokens is a copy of it); x = eh_proj(cat([enorm(e_k), "
    "hnorm(h_{k-1})], -1)) (EMBEDDING FIRST: eh_proj.weight[:, :hidden] multiplies enorm(e), [:, hidden:] "
    "hnorm(h)); x = transformer_layer(x) (the last decoder layer's spec: MLA + MoE here, same causal mask, rope "
    "positions 0..T-1 unshifted); h_k = final_layernorm(x) (DeepSeek's shared_head.norm); logits_k = the SHARED "
    "output layer(h_k) (lm_head; shared_head.head is a copy). Labels: mtp_labels = roll_tensor(labels, -1) once per "
    "depth, labels being the main next-token labels, so depth k predicts token i + 1 + k from position i; loss_mask "
    "rolled the same way (its last k positions 0), num_tokens_k = sum(rolled mask) = B*(T-k) with an all-ones mask. "
    "mtp_loss_k = sum(mask_k * CE_k) / num_tokens_k ('mtp' 'loss' here, with its 'num_tokens').",
    "MTP loss combination (gpt_model.py GPTModel._postprocess + MTPLossAutoScaler + pipeline_parallel/schedules.py "
    "forward_step_calc_loss): the MTP loss is NOT added to the returned loss; each depth attaches "
    "(mtp_loss_scaling_factor / mtp_num_layers) * sum(mask_k * CE_k) / num_tokens_k to the main hidden states via "
    "MTPLossAutoScaler, whose backward feeds it a gradient of main_loss_backward_scale = grad_scale / num_microbatches "
    "(1 unscaled, one microbatch). So the gradient is that of L = L_lm + (lambda / D) * sum_k mtp_loss_k per "
    "microbatch (mean over microbatches, like L_lm), lambda = --mtp-loss-scaling-factor (default 0.1). With "
    "--calculate-per-token-loss the MTP term is (lambda/D) * sum(mask_k * CE_k) (no division) and everything is "
    "divided by the main loss's token count later. Logging: MTPLossLoggingHelper.save_loss_to_tracker adds "
    "sum(mask_k * CE_k)/num_tokens_k (UNSCALED by lambda) per microbatch (training mode only); Megatron-LM's "
    "training_log calls track_mtp_metrics(loss_scale = 1/num_microbatches): all-reduce AVG over the DP x CP group, "
    "times 1/num_microbatches, logged as 'mtp_1 loss' ... 'mtp_D loss' (TensorBoard/W&B scalars and the log line, "
    "averaged over the log interval like 'lm loss'). 'lm loss' itself excludes MTP. With PP > 1 every MTP layer sits "
    "on the last stage (mtp_on_this_rank; a custom --pipeline-model-parallel-layout may move them) which keeps its "
    "own copy of the word embedding tied to the first stage's (models/common/language_module/language_module.py "
    "setup_embeddings_and_output_layer: zero-filled, all-reduced over the embedding group, gradients all-reduced "
    "there too), as with tied embeddings even when the output layer is untied.",
    "Float32 islands in these float64 references (each ~1e-7 relative): rope angles; the eager softmax; RMSNorm; the "
    "router (logits, sigmoid, bias, weights). transformers 4.57 ALSO accumulates the routed experts' outputs in a "
    "float32 buffer and so cannot run a float64 DeepSeek-V3 at all (DeepseekV3MoE.moe: index_add_ of float64 into "
    "float32 raises); this script patches that buffer to the promoted dtype (patch_float64_moe: float64 here, "
    "unchanged float32 for float32/bfloat16 models), the only change made to transformers' code. "
    "The e_score_correction_bias buffer loads as float64 under dtype=float64 (scores + bias then rounds differently "
    "from a float32 model): 'min_group_margin' and 'min_expert_margin' show the routing cuts are far from ties.",
    "generate() (generation/utils.py _sample) takes the argmax over next-token logits cast to float32; 'margins' are "
    "the float64 step logits' top-1 minus top-2. config.json as transformers 4.57 writes it names the weights' dtype "
    "'dtype' and adds head_dim (= qk_rope_head_dim), qk_head_dim, rope_interleave true and rope_scaling.rope_type.",
]


# ---------------------------------------------------------------------------------------------------
# Writing the references
# ---------------------------------------------------------------------------------------------------
def write(family, out):
    quiet()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    model = build(family)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".safetensors") or f.endswith(".json"):
            os.remove(os.path.join(out, f))
    model.save_pretrained(out, max_shard_size=SHARD, safe_serialization=True)
    assert os.path.exists(os.path.join(out, "model.safetensors.index.json")), "expected a sharded save"
    mem = {n: p.detach().clone() for n, p in model.named_parameters()}
    mem.update({n: b.detach().clone() for n, b in model.named_buffers() if "e_score" in n})
    torch.set_default_dtype(torch.float64)
    import transformers
    ref = {"family": family, "hub": HUB_REPO, "changes": SHRINK[family][1], "transformers": transformers.__version__,
           "torch": torch.__version__.split("+")[0], "mtp_loss_scaling_factor": MTP_LAMBDA, "batches": []}

    # Sanity: the saved float32 weights (main and MTP) are the built ones; what from_pretrained reports.
    ref_model, info = load(out, info=True)
    L = ref_model.config.num_hidden_layers
    for n, p in list(ref_model.named_parameters()) + [(n, b) for n, b in ref_model.named_buffers() if "e_score" in n]:
        assert torch.equal(p.detach(), mem[n].double()), f"{n} differs after the reload"
    saved = read_weights(out)
    for n, t in saved.items():
        assert torch.equal(t, mem[n]), f"{n} differs in the safetensors"
    unexpected = sorted(info["unexpected_keys"])
    assert unexpected and all(k.startswith(f"model.layers.{L}.") for k in unexpected), unexpected
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    ref["load"] = {"unexpected_keys": unexpected, "missing_keys": [], "mtp_keys_in_checkpoint": len(unexpected)}

    mem_model = model.double()
    mem_model.model.layers = mem_model.model.layers[:L]
    for i, seq in enumerate(batches()):
        m = load_model(out)
        mtp = mtp_modules(m, out)
        ids, tgt = seq[:, :-1], seq[:, 1:]
        h, pre = hidden_pair(m, ids)
        logits = m.lm_head(h)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
        with torch.no_grad():
            plain = m(input_ids=ids, use_cache=False).logits
            again = load_model(out)(input_ids=ids, use_cache=False).logits
            direct = mem_model(input_ids=ids, use_cache=False).logits
        assert torch.equal(plain, logits.detach()) and torch.equal(again, plain), "logits not reproducible"
        mloss, ntok, mlogits = mtp_forward(m, mtp, ids, tgt, (h, pre))
        r = {"ids": ids.tolist(), "targets": tgt.tolist(), "logits": logits.tolist(), "loss": loss.item(),
             "routing": routing_refs(load_model(out), ids), "mtp": {"loss": mloss.item(), "num_tokens": ntok}}
        if i == 1:
            r["mtp"]["logits"] = mlogits.tolist()
        print(f"  batch {i}: loss {loss.item():.6f}, mtp loss {mloss.item():.6f}; the in-memory model (float32 "
              f"built, .double()) differs from the reload by {(direct - logits).abs().max().item():.3g}")
        if i == 0:
            names, params = zip(*m.named_parameters())
            mnames, mparams = zip(*[(f"model.layers.{L}.{n}", p) for n, p in mtp.named_parameters()
                                    if not n.startswith(("embed_tokens", "shared_head.head"))])
            g_lm = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            g_mtp = torch.autograd.grad(mloss, params + mparams, allow_unused=True)
            r["grads"] = {n: stats(p, g) for n, p, g in zip(names, params, g_lm)}
            last = f"model.layers.{L - 1}."
            keep = lambda n: n.startswith((f"model.layers.{L}.", last, "model.layers.0.self_attn.")) or n in (
                "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
            r["mtp_grads"] = {n: stats(p, g) for n, p, g in zip(names + mnames, params + mparams, g_mtp) if keep(n)}
        ref["batches"].append(r)
    ref["rope"] = rope_state(load_model(out))
    check_rope_convention(load_model(out))
    ref["greedy"] = [greedy(out, p) for p in prompts()]
    ref["sensitivity"] = sensitivity(family, out, ref)
    ref["mtp_sensitivity"] = mtp_sensitivity(out, ref)
    ref["notes"] = NOTES
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {out}: {len(os.listdir(out))} files, {total} bytes; losses {[b['loss'] for b in ref['batches']]}, "
          f"mtp losses {[b['mtp']['loss'] for b in ref['batches']]}")
    for b in ref["batches"]:
        for k, v in b["routing"].items():
            print(f"  routing layer {k}: min group margin {v['min_group_margin']:.3g}, min expert margin "
                  f"{v['min_expert_margin']:.3g}")
    for g in ref["greedy"]:
        print(f"  greedy {g['prompt']} -> {g['tokens']} (min margin {min(g['margins']):.3g}, cache vs full "
              f"{g['cache_vs_full']:.3g}{'' if g['full_tokens'] == g['tokens'] else ', cache-free: ' + str(g['full_tokens'])})")
    for k, v in list(ref["sensitivity"].items()) + list(ref["mtp_sensitivity"].items()):
        print(f"  sensitivity: {k}: {', '.join(f'{x:.3g}' for x in v)}")
    print(f"  rope: {ref['rope']}")
    return ref


def check_export(family, d, out):
    quiet()
    with open(os.path.join(out, "ref.json")) as f:
        ref = json.load(f)
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    with open(os.path.join(d, "config.json")) as f:
        model_type = json.load(f).get("model_type")
    model, info = load(d, info=True)
    L = model.config.num_hidden_layers
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "mismatched_keys") and v}
    extra = [k for k in info["unexpected_keys"] if not k.startswith(f"model.layers.{L}.")]
    if extra:
        bad["unexpected_keys"] = extra
    if model_type != "deepseek_v3" or bad:
        print(f"{d}: not a {family} export: model_type {model_type!r}; {bad}")
        return 1
    worst = 0.0
    for b in ref["batches"]:
        with torch.no_grad():
            logits = load_model(d)(input_ids=torch.tensor(b["ids"]), use_cache=False).logits
        worst = max(worst, (logits - torch.tensor(b["logits"], dtype=torch.float64)).abs().max().item())
    print(f"{d}: transformers loaded the export as DeepseekV3ForCausalLM; max |logit - reference| = {worst:.3g}")
    ok = worst <= 1e-4
    for g in ref["greedy"]:
        m = load_model(d)
        gc = m.generation_config
        gc.eos_token_id = gc.pad_token_id = gc.bos_token_id = None
        with torch.no_grad():
            seq = m.generate(torch.tensor([g["prompt"]]), do_sample=False, max_new_tokens=len(g["tokens"]),
                             use_cache=True)[0].tolist()
        got = seq[len(g["prompt"]):]
        same = got == g["tokens"]
        ok = ok and same
        print(f"  greedy {g['prompt']}: export {got} {'==' if same else '!='} reference {g['tokens']}")
    m = load_model(d)
    mtp = mtp_modules(m, d)
    if mtp is None:
        print("  no MTP weights in the export")
    else:
        for b in ref["batches"]:
            ids, tgt = torch.tensor(b["ids"]), torch.tensor(b["targets"])
            with torch.no_grad():
                loss, _, _ = mtp_forward(m, mtp, ids, tgt, hidden_pair(m, ids))
            rel = abs(loss.item() - b["mtp"]["loss"]) / b["mtp"]["loss"]
            ok = ok and rel <= 1e-5
            print(f"  MTP loss {loss.item():.8f} vs reference {b['mtp']['loss']:.8f} (relative {rel:.3g})")
    return 0 if ok else 1


def compare_logits(d, ours_file):
    quiet()
    with open(ours_file) as f:
        ours = json.load(f)
    torch.set_default_dtype(torch.float64)
    model = load_model(d)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(ours["ids"]), use_cache=False).logits.reshape(-1, model.config.vocab_size)
    worst = (logits - torch.tensor(ours["logits"], dtype=torch.float64)).abs().max().item()
    print(f"{d}: transformers loaded the trained export as {type(model).__name__}; max |logit - mpitron f32| = "
          f"{worst:.3g}")
    return 0 if worst <= 1e-4 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", required=True, choices=FAMILIES + ["mcore", "all"])
    ap.add_argument("--out")
    ap.add_argument("--check-export", metavar="DIR")
    ap.add_argument("--compare-logits", nargs=2, metavar=("DIR", "OURS_JSON"))
    a = ap.parse_args()
    if a.family == "mcore":
        import mcore_deepseek_ref
        sys.exit(mcore_deepseek_ref.main(a.out or os.path.join(ROOT, "tests/apps/ref", MCORE_DIR),
                                         os.path.join(ROOT, "tests/apps/ref")))
    fams = FAMILIES if a.family == "all" else [a.family]
    if (a.check_export or a.compare_logits or a.out) and len(fams) != 1:
        ap.error("--check-export, --compare-logits and --out take one --family")
    out = a.out or os.path.join(ROOT, "tests/apps/ref", "hf_" + fams[0])
    if a.compare_logits:
        sys.exit(compare_logits(*a.compare_logits))
    if a.check_export:
        sys.exit(check_export(fams[0], a.check_export, out))
    for fam in fams:
        print(f"== {fam} ({HUB_REPO})")
        write(fam, a.out or os.path.join(ROOT, "tests/apps/ref", "hf_" + fam))
    if a.family == "all":  # Megatron-Core in a process of its own (its CPU shims patch torch globally)
        sys.exit(subprocess.call([sys.executable, os.path.abspath(__file__), "--family", "mcore"]))


if __name__ == "__main__":
    main()
