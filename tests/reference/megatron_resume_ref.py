#!/usr/bin/env python3
"""Megatron-Core trains, saves, and goes on: the losses mpitron must give when it resumes.

For tests/apps/test_megatron_resume.cpp (issue 43). megatron-core 0.16.1 (PyPI, CPU, gloo) trains a
small GPTModel for SAVE_AT steps on batches of megatron-core's own GPTDataset over an indexed
dataset (.bin/.idx, written here with its IndexedDatasetBuilder), with its DistributedOptimizer;
saves the state in both of Megatron-LM's formats (torch_dist and the legacy torch, as
tests/reference/torch_checkpoint_ref.py builds them: args, iteration, opt_param_scheduler, ...);
then trains the NEXT 5 steps on the next batches and records their losses (each step's loss before
its update: Megatron-LM's logged "lm loss"). mpitron, --load-ing either checkpoint with the
same data and hyper-parameters, must log those 5 losses.

Runs (tests/io/ref/megatron_resume/<name>/):
  gpt2          TP1 PP1, GPT-2 style: learned positions, LayerNorm, GELU (erf: F.gelu, unfused),
                biases, tied embedding; fp32
  llama         TP1 PP1, Llama style: rope, RMSNorm, SwiGLU, GQA (4 heads, 2 groups), no biases,
                untied output; fp32
  gpt2_tp2pp2   TP2 PP2 (4 processes), GPT-2 style; torch_dist only
each with torch_dist/ (and torch/), and ref.json: {"losses": [5 floats], "first_losses": [...],
"flags": the mpitron flags of the run}. data/: the dataset (tokens in [0, 256), documents ending in
256) and tokenizer.json (+ tokenizer_config.json): a byte-level BPE of the 256 bytes and
<|endoftext|> (257 tokens, so mpitron's vocabulary, padded to 272, is Megatron's padded_vocab_size).

The hyper-parameters are the mpitron flags in FLAGS: Adam (0.9, 0.95, 1e-8), weight decay 0.01
(Megatron: not on biases and norms), clip-grad 1.0, lr 1e-3 warmed up over 1 iteration and
cosine-decayed to 1e-4 over TOTAL iterations (Megatron's OptimizerParamScheduler in samples =
iterations × global batch), global batch 4 of micro-batches of 2, seed 1234 (the dataset's shuffle).

Run (the venv of tests/reference/requirements.txt: PyPI torch 2.x, megatron-core 0.16.1):
  /work/.venv-ref/bin/python tests/reference/megatron_resume_ref.py
"""
import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_checkpoint_ref as tcr  # noqa: E402  (its CPU shims and Megatron-LM args)

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(ROOT, "tests", "io", "ref", "megatron_resume")
SEQ, MBS, GBS = 16, 2, 4
HIDDEN, HEADS, KV = 8, 2, 4
VOCAB, PADDED = 257, 272  # 256 bytes + <|endoftext|>; padded as mpitron pads with --make-vocab-size-divisible-by
EOD = 256
SAVE_AT, NEXT = 3, 5
TOTAL = SAVE_AT + NEXT

RUNS = {
    # name: (style, tp, pp, legacy too)
    "gpt2": ("gpt2", 1, 1, True),
    "llama": ("llama", 1, 1, True),
    "gpt2_tp2pp2": ("gpt2", 2, 2, False),
}


def style_shape(style):
    llama = style == "llama"
    return dict(heads=4 if llama else HEADS, groups=2 if llama else None, kv=2 if llama else KV,
                ffn=16 if llama else 32)


def flags(style, tp, pp):
    """mpitron's pretrain_gpt flags for the hyper-parameters above (the model comes from the checkpoint)."""
    return (f"--use-checkpoint-args --micro-batch-size {MBS} --global-batch-size {GBS} --train-iters {TOTAL} "
            f"--lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 1 --lr-decay-iters {TOTAL} "
            "--weight-decay 0.01 --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --clip-grad 1.0 "
            "--hidden-dropout 0 --attention-dropout 0 --seed 1234 --split 1,0,0 --eval-iters 0 --log-interval 1 "
            f"--make-vocab-size-divisible-by {16 // tp} "
            "--tokenizer-type HuggingFaceTokenizer")


def write_data(d):
    os.makedirs(d, exist_ok=True)
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    rs = np.random.RandomState(43)
    b = IndexedDatasetBuilder(os.path.join(d, "tokens.bin"), dtype=np.uint16)
    for _ in range(60):
        n = int(rs.randint(3, 30))
        b.add_item(torch.from_numpy(np.concatenate([rs.randint(0, 256, n), [EOD]]).astype(np.int64)))
        b.end_document()
    b.finalize(os.path.join(d, "tokens.idx"))
    # GPT-2's byte-to-unicode map: the byte-level BPE's 256 base tokens
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for c in range(256):
        if c not in bs:
            bs.append(c)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in sorted(zip(bs, cs))}
    vocab = {k: v for k, v in sorted(vocab.items(), key=lambda kv: kv[1])}
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": EOD, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True}],
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": []}}
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|endoftext|>"}, f)


class Tok:
    """What GPTDataset asks of a tokenizer (no pad: GPTDataset then masks nothing)."""
    eod = EOD
    vocab_size = VOCAB
    unique_identifiers = {"class": "ByteLevelBPE257"}


def samples(data_dir):
    """megatron-core's GPTDataset over the dataset: the TOTAL × GBS training samples, in order."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    cfg = GPTDatasetConfig(random_seed=1234, sequence_length=SEQ, blend=([os.path.join(data_dir, "tokens")], None),
                           split="1,0,0", tokenizer=Tok(), reset_position_ids=False, reset_attention_mask=False,
                           eod_mask_loss=False, path_to_cache=tempfile.mkdtemp(), mmap_bin_files=True)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [TOTAL * GBS, 0, 0], lambda: True, cfg).build()
    out = []
    for i in range(TOTAL * GBS):
        s = train[i]
        assert bool((s["loss_mask"] == 1).all())
        out.append((s["tokens"].long(), s["labels"].long()))
    return out


def worker(rank, name, out, port, data):
    style, tp, pp, legacy = RUNS[name]
    world = tp * pp
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    tcr.cpu_shims()
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import torch.nn.functional as F
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.dist_checkpointing.utils import _clean_metadata_for_serialization
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.rerun_state_machine import get_rerun_state_machine
    from megatron.core.transformer.transformer_config import TransformerConfig
    parallel_state.initialize_model_parallel(tp, pp)
    tensor_parallel.random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    llama = style == "llama"
    sh = style_shape(style)
    torch.manual_seed(1234 + 100 * parallel_state.get_pipeline_model_parallel_rank())
    cfg = TransformerConfig(
        num_layers=2, hidden_size=HIDDEN, ffn_hidden_size=sh["ffn"], num_attention_heads=sh["heads"],
        num_query_groups=sh["groups"], kv_channels=sh["kv"], normalization="RMSNorm" if llama else "LayerNorm",
        gated_linear_unit=llama, activation_func=F.silu if llama else F.gelu, add_bias_linear=not llama,
        bias_activation_fusion=False, hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        params_dtype=torch.float32, pipeline_dtype=torch.float32, tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp, batch_p2p_comm=False, init_method_std=0.02)
    model = GPTModel(
        config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization=cfg.normalization),
        vocab_size=PADDED, max_sequence_length=SEQ, position_embedding_type="rope" if llama else "learned_absolute",
        share_embeddings_and_output_weights=not llama,
        pre_process=parallel_state.is_pipeline_first_stage(), post_process=parallel_state.is_pipeline_last_stage())
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(
        use_distributed_optimizer=True, grad_reduce_in_fp32=True), model)
    opt = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=1e-3, min_lr=1e-4, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.95,
        adam_eps=1e-8, clip_grad=1.0, params_dtype=torch.float32, use_distributed_optimizer=True), [ddp])
    sched = OptimizerParamScheduler(opt, init_lr=0.0, max_lr=1e-3, min_lr=1e-4, lr_warmup_steps=1 * GBS,
                                    lr_decay_steps=TOTAL * GBS, lr_decay_style="cosine", start_wd=0.01, end_wd=0.01,
                                    wd_incr_steps=TOTAL * GBS, wd_incr_style="constant")
    cfg.finalize_model_grads_func = finalize_model_grads
    mask = torch.triu(torch.ones(1, 1, SEQ, SEQ), 1).bool()
    nmicro = GBS // MBS

    def batches(step):
        for m in range(nmicro):
            got = data[step * GBS + m * MBS: step * GBS + (m + 1) * MBS]
            yield torch.stack([t for t, _ in got]), torch.stack([lab for _, lab in got])

    def forward_step(data_iterator, m):
        ids, labels = next(data_iterator)
        pos = torch.arange(SEQ).unsqueeze(0).expand(MBS, SEQ)
        out_t = m(ids, pos, mask, labels=labels)

        def loss_func(o):
            loss = o.float().mean()
            return loss, {"lm loss": loss.detach().clone()}
        return out_t, loss_func

    fb = get_forward_backward_func()
    losses = []

    def train(step):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        res = fb(forward_step_func=forward_step, data_iterator=batches(step), model=[ddp], num_microbatches=nmicro,
                 seq_length=SEQ, micro_batch_size=MBS, forward_only=False)
        ok, _, _ = opt.step()
        assert ok
        sched.step(increment=GBS)
        if res:
            losses.append(float(torch.stack([r["lm loss"] for r in res]).mean()))

    for step in range(SAVE_AT):
        train(step)

    tpr, ppr = parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_rank()

    def rng_state():
        return [{"random_rng_state": __import__("random").getstate(), "np_rng_state": np.random.get_state(),
                 "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.get_rng_state(),
                 "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()}}]

    def common(sd, fmt):
        a = tcr.megatron_args(style, tp, pp, 1, 2, out, fmt)
        sh2 = style_shape(style)
        for k, v in dict(hidden_size=HIDDEN, ffn_hidden_size=sh2["ffn"], num_attention_heads=sh2["heads"],
                         num_query_groups=sh2["groups"] or sh2["heads"], kv_channels=sh2["kv"],
                         max_position_embeddings=SEQ, seq_length=SEQ, vocab_size=VOCAB, padded_vocab_size=PADDED,
                         make_vocab_size_divisible_by=16 // tp, tokenizer_type="HuggingFaceTokenizer",
                         bias_gelu_fusion=False, micro_batch_size=MBS, global_batch_size=GBS, train_iters=TOTAL,
                         lr_decay_iters=TOTAL, bf16=False, params_dtype=torch.float32, iteration=SAVE_AT,
                         curr_iteration=SAVE_AT, consumed_train_samples=SAVE_AT * GBS, split="1,0,0",
                         eval_iters=0).items():
            setattr(a, k, v)
        a.rank = rank
        sd["args"] = a
        sd["checkpoint_version"] = 3.0
        sd["iteration"] = SAVE_AT
        sd["opt_param_scheduler"] = sched.state_dict()
        sd["rerun_state_machine"] = get_rerun_state_machine().state_dict(data_iterator=None, ckpt_format=fmt)
        sd["num_floating_point_operations_so_far"] = 0
        return sd

    tdir = os.path.join(out, "torch_dist")
    cdir = os.path.join(tdir, f"iter_{SAVE_AT:07d}")
    if rank == 0:
        os.makedirs(cdir, exist_ok=True)
    dist.barrier()
    md = {"distrib_optim_sharding_type": "dp_reshardable", "singleton_local_shards": False,
          "chained_optim_avoid_prefix": True,
          "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    sd = {"model": model.sharded_state_dict(metadata=md)}
    sd["optimizer"] = opt.sharded_state_dict(sd, metadata=md)
    common(sd, "torch_dist")
    sd["rng_state"] = ShardedObject("rng_state", rng_state(), (pp, tp), (ppr, tpr), replica_id=0)
    dist_checkpointing.save(sd, cdir, content_metadata=_clean_metadata_for_serialization(md))
    dist.barrier()
    if rank == 0:
        with open(os.path.join(tdir, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(SAVE_AT))
    if legacy:
        ldir = os.path.join(out, "torch")
        mp = f"mp_rank_{tpr:02d}" if pp == 1 else f"mp_rank_{tpr:02d}_{ppr:03d}"
        path = os.path.join(ldir, f"iter_{SAVE_AT:07d}", mp, "model_optim_rng.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        opt.save_parameter_state(os.path.join(os.path.dirname(path), "distrib_optim.pt"))
        sd = common({}, "torch")
        sd["model"] = model.state_dict_for_save_checkpoint()
        sd["optimizer"] = opt.state_dict()
        sd["rng_state"] = rng_state()
        torch.save(sd, path)
        dist.barrier()
        if rank == 0:
            with open(os.path.join(ldir, "latest_checkpointed_iteration.txt"), "w") as f:
                f.write(str(SAVE_AT))

    for step in range(SAVE_AT, TOTAL):
        train(step)
    if rank == world - 1:
        with open(os.path.join(out, ".losses.json"), "w") as f:
            json.dump(losses, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="*", default=list(RUNS), choices=list(RUNS))
    a = p.parse_args()
    data_dir = os.path.join(OUT, "data")
    shutil.rmtree(data_dir, ignore_errors=True)
    write_data(data_dir)
    data = samples(data_dir)
    import torch.multiprocessing as mp
    for name in a.only:
        style, tp, pp, _ = RUNS[name]
        out = os.path.join(OUT, name)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        mp.spawn(worker, args=(name, out, tcr.free_port(), data), nprocs=tp * pp, join=True)
        losses = json.load(open(os.path.join(out, ".losses.json")))
        os.remove(os.path.join(out, ".losses.json"))
        assert len(losses) == TOTAL
        ref = {"tool": f"megatron-core {__import__('megatron.core').core.package_info.__version__} GPTModel ({style}) "
                       f"TP={tp} PP={pp}, distributed optimizer, saved at iteration {SAVE_AT} of {TOTAL}",
               "first_losses": losses[:SAVE_AT], "losses": losses[SAVE_AT:],
               "flags": flags(style, tp, pp), "versions": tcr.versions()}
        with open(os.path.join(out, "ref.json"), "w") as f:
            json.dump(ref, f, indent=1)
        total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
        print(f"== {name}: losses {losses}; {total} bytes", flush=True)


if __name__ == "__main__":
    main()
