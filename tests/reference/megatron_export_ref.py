#!/usr/bin/env python3
"""megatron-core loads the Megatron-LM legacy checkpoint mpitron WROTE, and computes its logits.

For tests/apps/test_megatron_export.cpp (issue 43). Per case:
  1. mpitron's convert_checkpoint --direction megatron-to-mpitron reads a committed megatron-core
     checkpoint (tests/io/ref/megatron_resume/<source>/torch_dist) into mpitron's format;
  2. convert_checkpoint --direction mpitron-to-megatron writes it back as Megatron-LM's legacy
     `torch` format (iter_XXXXXXX/mp_rank_TT[_PPP]/model_optim_rng.pt) at TP x PP;
  3. megatron-core 0.16.1 (PyPI, CPU, gloo, one process per TP rank) builds a GPTModel from the
     written file's own `args` (local layer spec), torch.load's its file (weights_only=False: it
     holds argparse.Namespace), load_state_dict(strict=True), and computes logits on fixed tokens
     (tensor-parallel shards gathered).
Written to tests/io/ref/megatron_export/<case>.json: the tokens, megatron-core's logits (float32,
(B, T, padded vocab)), and the size and CRC-32 of every file mpitron wrote, so the CI test proves
that its re-written bytes are the ones megatron-core loaded, then compares mpitron's own logits.

Run (after building mpitron; the venv of tests/reference/requirements.txt):
  /work/.venv-ref/bin/python tests/reference/megatron_export_ref.py [--build build]
"""
import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_checkpoint_ref as tcr  # noqa: E402  (its CPU shims)

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SRC = os.path.join(ROOT, "tests", "io", "ref", "megatron_resume")
OUT = os.path.join(ROOT, "tests", "io", "ref", "megatron_export")
B, T = 2, 8

CASES = {
    # name: (source run, tp, pp) — megatron-core loads at TP x PP = tp x 1 (pp must be 1 here)
    "gpt2_tp1": ("gpt2", 1, 1),
    "llama_tp2": ("llama", 2, 1),
}


def tokens():
    rs = np.random.RandomState(4343)
    return rs.randint(0, 257, size=(B, T)).tolist()


def worker(rank, ckpt, tp, out_json, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(tp))
    torch.set_num_threads(1)
    tcr.cpu_shims()
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=tp)
    import torch.nn.functional as F
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig
    parallel_state.initialize_model_parallel(tp, 1)
    tensor_parallel.random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    it = int(open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read().strip())
    mp = f"mp_rank_{rank:02d}"
    sd = torch.load(os.path.join(ckpt, f"iter_{it:07d}", mp, "model_optim_rng.pt"), weights_only=False)
    a = sd["args"]
    assert sd["checkpoint_version"] == 3.0 and sd["iteration"] == it and a.tensor_model_parallel_size == tp
    if a.swiglu:
        act = F.silu
    elif a.openai_gelu:
        act = lambda x: F.gelu(x, approximate="tanh")  # noqa: E731
    else:
        act = F.gelu
    cfg = TransformerConfig(
        num_layers=a.num_layers, hidden_size=a.hidden_size, ffn_hidden_size=a.ffn_hidden_size,
        num_attention_heads=a.num_attention_heads,
        num_query_groups=a.num_query_groups if a.group_query_attention else None, kv_channels=a.kv_channels,
        normalization=a.normalization, layernorm_epsilon=a.norm_epsilon, gated_linear_unit=a.swiglu,
        activation_func=act, add_bias_linear=a.add_bias_linear, add_qkv_bias=a.add_qkv_bias,
        bias_activation_fusion=False, hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        params_dtype=torch.float32, tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
        init_method_std=a.init_method_std)
    model = GPTModel(
        config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization=a.normalization),
        vocab_size=a.padded_vocab_size, max_sequence_length=a.max_position_embeddings,
        position_embedding_type=a.position_embedding_type, rotary_base=a.rotary_base,
        rotary_percent=a.rotary_percent,
        share_embeddings_and_output_weights=not a.untie_embeddings_and_output_weights)
    # strict: every key GPTModel has (the _extra_state entries included) and no other
    model.load_state_dict(sd["model"], strict=True)
    model.eval()
    ids = torch.tensor(tokens())
    pos = torch.arange(T).unsqueeze(0).expand(B, T)
    mask = torch.triu(torch.ones(1, 1, T, T), 1).bool()
    with torch.no_grad():
        logits = model(ids, pos, mask)  # (B, T, V / tp)
    parts = [torch.empty_like(logits) for _ in range(tp)]
    dist.all_gather(parts, logits.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
    full = torch.cat(parts, dim=-1)
    if rank == 0:
        with open(out_json, "w") as f:
            json.dump({"logits": full.float().tolist(), "keys": len(sd["model"])}, f)
    dist.barrier()
    dist.destroy_process_group()


def file_table(ckpt):
    out = {}
    for d, _, fs in os.walk(ckpt):
        for f in sorted(fs):
            p = os.path.join(d, f)
            data = open(p, "rb").read()
            out[os.path.relpath(p, ckpt)] = {"size": len(data), "crc32": zlib.crc32(data) & 0xFFFFFFFF}
    return dict(sorted(out.items()))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--only", nargs="*", default=list(CASES), choices=list(CASES))
    a = p.parse_args()
    conv = os.path.join(a.build, "apps", "convert_checkpoint")
    os.makedirs(OUT, exist_ok=True)
    import torch.multiprocessing as mpr
    for name in a.only:
        src, tp, pp = CASES[name]
        tmp = tempfile.mkdtemp(prefix="megexp")
        try:
            mpi = os.path.join(tmp, "mpitron")
            meg = os.path.join(tmp, "megatron")
            flags = f"--target-tensor-parallel-size {tp} --target-pipeline-model-parallel-size {pp}"
            subprocess.run([conv, "--direction", "megatron-to-mpitron", "--input",
                            os.path.join(SRC, src, "torch_dist"), "--output", mpi], check=True)
            subprocess.run([conv, "--direction", "mpitron-to-megatron", "--input", mpi, "--output", meg]
                           + flags.split(), check=True)
            res = os.path.join(tmp, "res.json")
            mpr.spawn(worker, args=(meg, tp, res, tcr.free_port()), nprocs=tp, join=True)
            got = json.load(open(res))
            ref = {"tool": f"megatron-core {__import__('megatron.core').core.package_info.__version__} GPTModel "
                           f"(local spec) at TP={tp}, load_state_dict(strict=True) of the legacy checkpoint mpitron "
                           f"wrote from tests/io/ref/megatron_resume/{src}/torch_dist",
                   "source": f"{src}/torch_dist", "convert_flags": flags, "tokens": tokens(),
                   "state_dict_entries": got["keys"], "files": file_table(meg), "logits": got["logits"],
                   "versions": tcr.versions()}
            with open(os.path.join(OUT, name + ".json"), "w") as f:
                json.dump(ref, f)
            print(f"== {name}: {len(ref['files'])} files, {got['keys']} state-dict entries", flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
