#!/usr/bin/env python3
"""Megatron-Core 0.16.1's view of hf_deepseek_ref.py's deepseek_v3 model: a GPTModel with multi-latent
attention, group-limited sigmoid routing with expert bias, a shared expert, first-k-dense layers and one
MTP layer, built on the CPU from the SAME weights (tests/apps/ref/hf_deepseek_v3), run forward and
backward on the same token batches. Run through hf_deepseek_ref.py --family mcore (its own process: the
CPU shims below patch torch globally).

Writes tests/apps/ref/mcore_deepseek_v3/:
  model.safetensors  the weights under Megatron-Core names (float32, the HF values; linear_fc1 = [gate; up]
                     stacked on dim 0; router.expert_bias = e_score_correction_bias);
  weights.json       {Megatron name: {"shape", "dtype", "hf": [source names, stacked in this order on dim 0]}};
  ref.json           "config" (the MLATransformerConfig fields that matter), per batch "ids", "labels",
                     "stock" (megatron-core as installed) and "hf_group_rule" (group_limited_topk patched to
                     transformers' sum-of-top-2 group score): "lm_loss_per_token" [B][T] (float32: Megatron's
                     cross entropy upcasts logits to float32), "lm_loss" (their mean), "mtp_1_loss"
                     (MTPLossLoggingHelper's tracker value after one training-mode forward: what Megatron-LM
                     logs as 'mtp_1 loss' with one microbatch, DP = 1), "experts" per MoE router (decoder
                     layers 2, 3 and the MTP layer: chosen experts per token, ascending, tokens in (t, b) order
                     = Megatron's [s, b] flattening); batch 0 "stock" also "grads" (Megatron names: norm, rms,
                     12 samples) of lm_loss.mean() backpropagated through MTPLossAutoScaler, i.e. of
                     lm loss + mtp_loss_scaling_factor / mtp_num_layers * mtp_1 loss; "checks": the
                     hf_group_rule run against transformers + hf_deepseek_ref.py's MTP transcription on the same
                     weights (max |d| of losses, routing and every gradient); "noqlora": the same run on
                     hf_deepseek_v3_noqlora (linear_q_proj; losses and checks only, not exported); "notes".

CPU shims (see tests/reference/torch_checkpoint_ref.py and shared/REFERENCES.md): torch factory calls
with device='cuda' -> cpu, Tensor.cuda() the identity, torch.cuda.current_device -> cpu,
torch.cuda.synchronize a no-op, the RNG tracker's fork a null context, an explicit causal mask; and for
MLA + MoE without Transformer Engine three more, each a bug or gap of megatron-core 0.16.1 on a machine
without TE (described in NOTES below).
"""
import contextlib
import json
import os

import torch

import hf_deepseek_ref as hf

SAMPLES = 12


def cpu_shims():
    def cpu_device(fn):
        def w(*a, **k):
            d = k.get("device")
            if d is not None and "cuda" in str(d):
                k["device"] = "cpu"
            return fn(*a, **k)
        return w
    for n in ["tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "empty_like", "ones_like"]:
        setattr(torch, n, cpu_device(getattr(torch, n)))
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda *a, **k: None


def te_free_shims():
    """megatron-core 0.16.1 without Transformer Engine: (1) megatron.core.extensions.transformer_engine
    leaves MagicMock placeholders for TELinear / TEColumnParallelLinear when TE is absent, and
    multi_latent_attention.py imports them without failing (HAVE_TE = True) and later calls
    isinstance(self.linear_proj, TELinear), a TypeError: they are replaced by an empty class; (2)
    moe_utils.py references te_general_gemm, undefined without TE, in RouterGatingLinearFunction (a
    NameError): set to None (its own non-TE branch); (3) MLA builds its core attention with
    k_channels / v_channels, which only TEDotProductAttention accepts: MLALocalCoreAttention below is the
    local DotProductAttention taking them (the output width becomes heads * v_channels; its maths are
    DotProductAttention's own: baddbmm(q, k^T, alpha = softmax_scale), FusedScaleMaskSoftmax's torch path,
    bmm with v)."""
    import megatron.core.transformer.multi_latent_attention as mla
    import megatron.core.transformer.moe.moe_utils as mu

    class NoTE:
        pass
    mla.TELinear = mla.TEColumnParallelLinear = NoTE
    mu.te_general_gemm = None


def core_attention_class():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class MLALocalCoreAttention(DotProductAttention):
        def __init__(self, *a, k_channels=None, v_channels=None, **k):
            super().__init__(*a, **k)
            if v_channels is not None:
                self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition
    return MLALocalCoreAttention


def hf_group_rule(scores, topk, num_tokens, num_experts, num_groups, group_topk):
    """group_limited_topk with transformers' group score (the sum of the top 2 of each group) instead of
    megatron-core's sum of the top (topk // group_topk); otherwise moe_utils.group_limited_topk verbatim."""
    group_scores = scores.view(num_tokens, num_groups, -1).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = (group_mask.unsqueeze(-1).expand(num_tokens, num_groups, num_experts // num_groups)
                  .reshape(num_tokens, -1))
    masked_scores = scores.masked_fill(~score_mask.bool(), float('-inf'))
    return torch.topk(masked_scores, k=topk, dim=-1)


def name_map(c):
    """{Megatron-Core name: [HF / DeepSeek names stacked on dim 0]} for config c (an HF config)."""
    m = {"embedding.word_embeddings.weight": ["model.embed_tokens.weight"],
         "decoder.final_layernorm.weight": ["model.norm.weight"],
         "output_layer.weight": ["lm_head.weight"]}

    def layer(mp, hp, moe):
        a, h = mp + "self_attention.", hp + "self_attn."
        m[mp + "input_layernorm.weight"] = [hp + "input_layernorm.weight"]
        if c.q_lora_rank is not None:
            m[a + "linear_q_down_proj.weight"] = [h + "q_a_proj.weight"]
            m[a + "q_layernorm.weight"] = [h + "q_a_layernorm.weight"]
            m[a + "linear_q_up_proj.weight"] = [h + "q_b_proj.weight"]
        else:
            m[a + "linear_q_proj.weight"] = [h + "q_proj.weight"]
        m[a + "linear_kv_down_proj.weight"] = [h + "kv_a_proj_with_mqa.weight"]
        m[a + "kv_layernorm.weight"] = [h + "kv_a_layernorm.weight"]
        m[a + "linear_kv_up_proj.weight"] = [h + "kv_b_proj.weight"]
        m[a + "linear_proj.weight"] = [h + "o_proj.weight"]
        m[mp + "pre_mlp_layernorm.weight"] = [hp + "post_attention_layernorm.weight"]

        def mlp(mq, hq):
            m[mq + "linear_fc1.weight"] = [hq + "gate_proj.weight", hq + "up_proj.weight"]
            m[mq + "linear_fc2.weight"] = [hq + "down_proj.weight"]
        if moe:
            m[mp + "mlp.router.weight"] = [hp + "mlp.gate.weight"]
            m[mp + "mlp.router.expert_bias"] = [hp + "mlp.gate.e_score_correction_bias"]
            for e in range(c.n_routed_experts):
                mlp(f"{mp}mlp.experts.local_experts.{e}.", f"{hp}mlp.experts.{e}.")
            mlp(mp + "mlp.shared_experts.", hp + "mlp.shared_experts.")
        else:
            mlp(mp + "mlp.", hp + "mlp.")

    L = c.num_hidden_layers
    for i in range(L):
        layer(f"decoder.layers.{i}.", f"model.layers.{i}.", i >= c.first_k_dense_replace)
    for k in range(c.num_nextn_predict_layers):
        mp, hp = f"mtp.layers.{k}.", f"model.layers.{L + k}."
        m[mp + "enorm.weight"] = [hp + "enorm.weight"]
        m[mp + "hnorm.weight"] = [hp + "hnorm.weight"]
        m[mp + "eh_proj.weight"] = [hp + "eh_proj.weight"]
        m[mp + "final_layernorm.weight"] = [hp + "shared_head.norm.weight"]
        layer(mp + "transformer_layer.", hp, True)
    return m


def mcore_config(c, dtype):
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import MLATransformerConfig
    rs = c.rope_scaling
    k_dense = c.first_k_dense_replace
    return MLATransformerConfig(
        num_layers=c.num_hidden_layers, hidden_size=c.hidden_size, ffn_hidden_size=c.intermediate_size,
        num_attention_heads=c.num_attention_heads, q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank,
        qk_head_dim=c.qk_nope_head_dim, qk_pos_emb_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim,
        normalization="RMSNorm", layernorm_epsilon=c.rms_norm_eps, qk_layernorm=True,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, params_dtype=dtype, pipeline_dtype=dtype,
        rope_type="yarn", rotary_base=c.rope_theta, rotary_scaling_factor=rs["factor"],
        original_max_position_embeddings=rs["original_max_position_embeddings"], beta_fast=rs["beta_fast"],
        beta_slow=rs["beta_slow"], mscale=rs["mscale"], mscale_all_dim=rs["mscale_all_dim"],
        num_moe_experts=c.n_routed_experts, moe_ffn_hidden_size=c.moe_intermediate_size,
        moe_shared_expert_intermediate_size=c.moe_intermediate_size * c.n_shared_experts,
        moe_router_topk=c.num_experts_per_tok,
        moe_layer_freq=[0 if i < k_dense else 1 for i in range(c.num_hidden_layers)],
        moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
        moe_router_num_groups=c.n_group, moe_router_group_topk=c.topk_group,
        moe_router_topk_scaling_factor=c.routed_scaling_factor, moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0, moe_token_dispatcher_type="allgather", moe_router_dtype="fp64",
        mtp_num_layers=c.num_nextn_predict_layers, mtp_loss_scaling_factor=hf.MTP_LAMBDA)


CONFIG_KEYS = ["num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
               "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "normalization", "layernorm_epsilon",
               "qk_layernorm", "gated_linear_unit", "rope_type", "rotary_base", "rotary_scaling_factor",
               "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
               "num_moe_experts", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_router_topk",
               "moe_layer_freq", "moe_router_score_function", "moe_router_enable_expert_bias",
               "moe_router_num_groups", "moe_router_group_topk", "moe_router_topk_scaling_factor",
               "moe_router_load_balancing_type", "moe_token_dispatcher_type", "moe_router_dtype",
               "mtp_num_layers", "mtp_loss_scaling_factor"]

NOTES = [
    "What ran: megatron-core 0.16.1 GPTModel(MLATransformerConfig(...), get_gpt_decoder_block_spec(config, "
    "use_transformer_engine=False) (the local spec: ColumnParallelLinear/RowParallelLinear, torch RMSNorm since "
    "apex is absent, SequentialMLP experts, TopKRouter, allgather dispatcher), mtp_block_spec="
    "get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False) (the MTP layer takes the LAST decoder "
    "layer's spec: MLA + MoE), position_embedding_type 'rope' (MLA computes its own yarn rope), untied), float64 "
    "parameters (torch default dtype float64 while building, so the RMSNorm weights are float64 too), one gloo "
    "rank, TP = PP = EP = CP = 1, training mode, dropout 0, qk_layernorm True: in megatron-core's MLA specs the "
    "latent norms q_layernorm (= q_a_layernorm) and kv_layernorm (= kv_a_layernorm) are IdentityOp unless "
    "--qk-layernorm is given, so a DeepSeek-V3 model needs --qk-layernorm.",
    "Blocked on the CPU and worked around (te_free_shims): megatron-core 0.16.1's MLA needs Transformer Engine's "
    "core attention (MultiLatentAttention.__init__ builds core_attention with k_channels/v_channels, which the "
    "local DotProductAttention rejects) and two TE-less code paths crash (multi_latent_attention.py: isinstance "
    "against the MagicMock TELinear placeholder; moe_utils.py: te_general_gemm undefined). The alltoall "
    "dispatcher creates a torch.cuda.Stream in __init__ (fails without a GPU): the allgather dispatcher is used "
    "(EP = 1: the same maths).",
    "Megatron's cross entropy (tensor_parallel.vocab_parallel_cross_entropy) upcasts logits to float32 (even "
    "float64 ones): lm_loss_per_token and the MTP losses are float32-rounded; its RMSNorm (torch.rms_norm) stays "
    "in float64, transformers' in float32: expect ~1e-7 relative differences between the two stacks.",
    "stock vs hf_group_rule: megatron-core scores a group by the sum of its top (moe_router_topk // "
    "moe_router_group_topk) = 2 // 2 = 1 scores (the max), transformers by the sum of its top 2 (always). With "
    "groups of 2 experts, topk_group 2 and k 2, the max rule is the same as no group limit at all (the best two "
    "experts always lie in the two groups with the best maxima): 'stock' routes as an unlimited top-2. "
    "hf_group_rule patches moe_utils.group_limited_topk to the sum of the top 2 (hf_group_rule() here) and then "
    "reproduces transformers: see 'checks'.",
    "MTP in this run (gpt_model.py GPTModel._postprocess, multi_token_prediction.py): the returned per-token loss "
    "is the main loss only; MTPLossAutoScaler attaches (0.1 / 1) * sum(mask * CE_mtp) / num_tokens to the hidden "
    "states, so lm_loss.mean().backward() (one microbatch, main_loss_backward_scale 1) gives the gradient of lm "
    "loss + 0.1 * mtp_1 loss ('grads'); 'mtp_1_loss' is MTPLossLoggingHelper.tracker['values'][0] "
    "(sum(mask * CE)/num_tokens, unscaled), what training_log prints as 'mtp_1 loss' with one microbatch and DP = 1.",
    "Weight mapping (weights.json): HF q_a_proj/q_a_layernorm/q_b_proj/q_proj/kv_a_proj_with_mqa/kv_a_layernorm/"
    "kv_b_proj/o_proj -> self_attention.linear_q_down_proj/q_layernorm/linear_q_up_proj/linear_q_proj/"
    "linear_kv_down_proj/kv_layernorm/linear_kv_up_proj/linear_proj (no permutation: Megatron de-interleaves the "
    "rope part at run time exactly as transformers does); input_layernorm -> input_layernorm, "
    "post_attention_layernorm -> pre_mlp_layernorm; gate_proj, up_proj -> linear_fc1 = [gate; up] (dim 0), "
    "down_proj -> linear_fc2 (dense MLP, experts.local_experts.e, shared_experts); mlp.gate.weight -> "
    "mlp.router.weight, e_score_correction_bias -> mlp.router.expert_bias (a float32 buffer); model.norm -> "
    "decoder.final_layernorm; MTP model.layers.4.{enorm, hnorm, eh_proj, shared_head.norm} -> mtp.layers.0."
    "{enorm, hnorm, eh_proj, final_layernorm} and its decoder-layer weights -> mtp.layers.0.transformer_layer.*; "
    "model.layers.4.embed_tokens and shared_head.head have NO Megatron counterpart (the MTP uses GPTModel."
    "embedding and output_layer).",
]


def stats(g):
    g = g.reshape(-1)
    idx = torch.linspace(0, g.numel() - 1, SAMPLES).round().long().unique()
    return {"norm": g.norm().item(), "rms": (g.norm() / g.numel() ** 0.5).item(),
            "sample": [[int(k), g[k].item()] for k in idx]}


def hf_side(hf_dir):
    """transformers (float64) on the saved model: per batch the loss, MTP loss (hf_deepseek_ref's Megatron
    transcription), and for batch 0 the full gradients of loss + lambda * mtp_loss (HF names)."""
    hf.quiet()
    torch.set_default_dtype(torch.float64)
    res = []
    for i, seq in enumerate(hf.batches()):
        m = hf.load_model(hf_dir)
        mtp = hf.mtp_modules(m, hf_dir)
        L = m.config.num_hidden_layers
        ids, tgt = seq[:, :-1], seq[:, 1:]
        h, pre = hf.hidden_pair(m, ids)
        logits = m.lm_head(h)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
        mloss, _, _ = hf.mtp_forward(m, mtp, ids, tgt, (h, pre))
        r = {"ids": ids, "tgt": tgt, "loss": loss.item(), "mtp": mloss.item(),
             "routing": hf.routing_refs(hf.load_model(hf_dir), ids)}
        if i == 0:
            named = list(m.named_parameters()) + [(f"model.layers.{L}.{n}", p) for n, p in mtp.named_parameters()
                                                  if not n.startswith(("embed_tokens", "shared_head.head"))]
            grads = torch.autograd.grad(loss + hf.MTP_LAMBDA * mloss, [p for _, p in named], allow_unused=True)
            r["grads"] = {n: (torch.zeros_like(p) if g is None else g) for (n, p), g in zip(named, grads)}
        res.append(r)
    return res


def setup():
    cpu_shims()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(hf_free_port()), RANK="0", WORLD_SIZE="1")
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state, tensor_parallel
    te_free_shims()
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()


def megatron_run(hf_dir, ref_hf):
    """Builds the GPTModel for hf_dir's config, loads hf_dir's weights, runs stock and hf_group_rule on
    ref_hf's batches; returns (mcore config, name map, Megatron-named weights, [(stock, patched)], checks)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper
    hf_cfg = hf.load_model(hf_dir).config
    weights = hf.read_weights(hf_dir)
    torch.set_default_dtype(torch.float64)
    cfg = mcore_config(hf_cfg, torch.float64)
    spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization="RMSNorm")
    core = core_attention_class()
    for ls in spec.layer_specs:
        ls.submodules.self_attention.submodules.core_attention = core
    mtp_spec = get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=False)
    model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=hf_cfg.vocab_size,
                     max_sequence_length=hf_cfg.max_position_embeddings, position_embedding_type="rope",
                     share_embeddings_and_output_weights=False, mtp_block_spec=mtp_spec)

    # Weights: every parameter and the expert_bias buffers from the HF safetensors, nothing else.
    nm = name_map(hf_cfg)
    state = {n: t for n, t in model.state_dict().items() if "_extra_state" not in n}
    runtime = [n for n in state if n.endswith(("rotary_pos_emb.cos_cached", "rotary_pos_emb.sin_cached",
                                               "local_tokens_per_expert"))]
    assert sorted(set(state) - set(runtime)) == sorted(nm), (sorted(set(state) - set(runtime) - set(nm)),
                                                              sorted(set(nm) - set(state)))
    mc_weights = {}
    with torch.no_grad():
        for n, srcs in nm.items():
            w = torch.cat([weights[s] for s in srcs], dim=0) if len(srcs) > 1 else weights[srcs[0]]
            t = state[n]
            assert tuple(t.shape) == tuple(w.shape), (n, t.shape, w.shape)
            t.copy_(w.to(t.dtype))
            mc_weights[n] = w.contiguous()
    for n, p in model.named_parameters():
        assert p.dtype == torch.float64, (n, p.dtype)

    routers = {n: mod for n, mod in model.named_modules() if n.endswith("mlp.router")}
    seen = {}
    for n, r in routers.items():
        r.register_forward_hook(lambda mod, i, o, n=n: seen.__setitem__(n, o[1].detach().clone()))

    def run(ids, labels, grads):
        model.zero_grad(set_to_none=True)
        seen.clear()
        MTPLossLoggingHelper.tracker.clear()
        s = ids.shape[1]
        pos = torch.arange(s)[None].expand(ids.shape[0], s)
        mask = torch.triu(torch.ones(1, 1, s, s), 1).bool()
        model.train()
        loss = model(ids, pos, mask, labels=labels)
        r = {"lm_loss_per_token": loss.tolist(), "lm_loss": loss.mean().item(),
             "mtp_1_loss": MTPLossLoggingHelper.tracker["values"][0].item(),
             "experts": {n: [torch.nonzero(row).reshape(-1).tolist() for row in seen[n]] for n in sorted(seen)}}
        if grads:
            loss.mean().backward()
            r["grad_tensors"] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        return r

    original = moe_utils.group_limited_topk
    res = []
    for i, h in enumerate(ref_hf):
        ids, labels = h["ids"], h["tgt"]
        stock = run(ids, labels, grads=i == 0)
        moe_utils.group_limited_topk = hf_group_rule
        try:
            patched = run(ids, labels, grads=i == 0)
        finally:
            moe_utils.group_limited_topk = original
        res.append((stock, patched))

    # Checks of the patched run against transformers + the MTP transcription (same weights).
    checks = []
    for i, ((stock, patched), h) in enumerate(zip(res, ref_hf)):
        c = {"batch": i, "lm_loss_vs_hf": abs(patched["lm_loss"] - h["loss"]),
             "mtp_1_loss_vs_transcription": abs(patched["mtp_1_loss"] - h["mtp"])}
        same = True
        B, T = h["ids"].shape
        for layer, rt in h["routing"].items():
            mine = patched["experts"][f"decoder.layers.{layer}.mlp.router"]  # (t, b) order
            hf_rows = rt["experts"]  # (b, t) order
            same = same and all(mine[t * B + b] == hf_rows[b * T + t] for b in range(B) for t in range(T))
        c["routing_equal_hf"] = same
        c["tokens_routed_differently_stock_vs_hf_rule"] = {
            n: sum(a != b for a, b in zip(stock["experts"][n], patched["experts"][n])) for n in sorted(stock["experts"])}
        if "grad_tensors" in patched:
            worst, worst_rel = 0.0, 0.0
            for n, srcs in nm.items():
                if n.endswith("expert_bias"):
                    continue
                g_hf = torch.cat([h["grads"][s] for s in srcs], dim=0)
                d = (patched["grad_tensors"][n] - g_hf).abs().max().item()
                worst = max(worst, d)
                worst_rel = max(worst_rel, d / max(g_hf.abs().max().item(), 1e-30))
            c["grads_vs_hf_max_abs"] = worst
            c["grads_vs_hf_max_rel_to_tensor_max"] = worst_rel
        assert c["lm_loss_vs_hf"] < 1e-6 and c["mtp_1_loss_vs_transcription"] < 1e-6 and same, c
        assert c.get("grads_vs_hf_max_rel_to_tensor_max", 0.0) < 1e-5, c
        checks.append(c)
    return cfg, nm, mc_weights, res, checks


def main(out, hf_root):
    """hf_root: tests/apps/ref; the deepseek_v3 model is exported, deepseek_v3_noqlora only checked."""
    torch.set_num_threads(1)
    hf_dir = os.path.join(hf_root, "hf_deepseek_v3")
    nq_dir = os.path.join(hf_root, "hf_deepseek_v3_noqlora")
    ref_hf, ref_nq = hf_side(hf_dir), hf_side(nq_dir)
    setup()
    import megatron.core
    cfg, nm, mc_weights, res, checks = megatron_run(hf_dir, ref_hf)
    _, _, _, res_nq, checks_nq = megatron_run(nq_dir, ref_nq)

    batches = []
    for (stock, patched), h in zip(res, ref_hf):
        b = {"ids": h["ids"].tolist(), "labels": h["tgt"].tolist()}
        for key, r in (("stock", stock), ("hf_group_rule", patched)):
            d = {k: v for k, v in r.items() if k != "grad_tensors"}
            if key == "stock" and "grad_tensors" in r:
                d["grads"] = {n: stats(g) for n, g in r["grad_tensors"].items()}
            b[key] = d
        batches.append(b)
    noqlora = [{"stock": {"lm_loss": s["lm_loss"], "mtp_1_loss": s["mtp_1_loss"]},
                "hf_group_rule": {"lm_loss": p["lm_loss"], "mtp_1_loss": p["mtp_1_loss"]}} for s, p in res_nq]

    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith((".safetensors", ".json")):
            os.remove(os.path.join(out, f))
    from safetensors.torch import save_file
    save_file(mc_weights, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "weights.json"), "w") as f:
        json.dump({n: {"shape": list(w.shape), "dtype": "float32", "hf": nm[n]} for n, w in mc_weights.items()},
                  f, separators=(",", ":"))
    conf = {}
    for k in CONFIG_KEYS:
        v = getattr(cfg, k)
        conf[k] = v if isinstance(v, (int, float, str, bool, list, type(None))) else str(v)
    ref = {"megatron_core": megatron.core.__version__, "torch": torch.__version__.split("+")[0],
           "source": "tests/apps/ref/hf_deepseek_v3 (hf_deepseek_ref.py)", "config": conf, "batches": batches,
           "checks": checks, "noqlora": {"source": "tests/apps/ref/hf_deepseek_v3_noqlora (q_lora_rank None: "
                                                    "linear_q_proj); not exported, checked only",
                                         "batches": noqlora, "checks": checks_nq},
           "notes": NOTES}
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {out}: {sorted(os.listdir(out))}, {total} bytes")
    for name, rs, rh, cs in (("deepseek_v3", res, ref_hf, checks), ("deepseek_v3_noqlora", res_nq, ref_nq, checks_nq)):
        for i, (stock, patched) in enumerate(rs):
            print(f"  {name} batch {i}: stock lm loss {stock['lm_loss']:.8f} mtp_1 {stock['mtp_1_loss']:.8f}; hf group "
                  f"rule lm loss {patched['lm_loss']:.8f} mtp_1 {patched['mtp_1_loss']:.8f} (transformers "
                  f"{rh[i]['loss']:.8f}, transcription {rh[i]['mtp']:.8f})")
        for c in cs:
            print(f"  checks: {c}")
    import torch.distributed as dist
    dist.destroy_process_group()
    return 0


def hf_free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
