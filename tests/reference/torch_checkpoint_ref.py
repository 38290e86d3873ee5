#!/usr/bin/env python3
"""Reference PyTorch checkpoints written by the real tools, for mpitron's C++ reader of torch.save
files (io/torch_zip.h, io/torch_pickle.h, io/torch_checkpoint.h, io/torch_dist.h), and a JSON listing
of what torch itself reads in each.

Run from the repository root with the reference venv (torch 2.15, megatron-core 0.16.1,
deepspeed 0.19.8; scripts/setup-reference-venv.sh):
    /work/.venv-ref/bin/python tests/reference/torch_checkpoint_ref.py [--only NAME ...] [--out DIR]

Writes tests/io/ref/torch/<NAME>/ for every NAME below (default: all), each with the checkpoint as the
tool wrote it and a ref.json (the LISTING, format below):

  synthetic        torch.save of a value tree with every storage dtype (f32/f64/f16/bf16/f8 e4m3fn and
                   e5m2/bool/u8/i8/i16/i32/i64), views (offset, transposed and sliced strides, two
                   tensors sharing one storage), a Parameter, OrderedDict with _metadata, torch.Size,
                   sets, bytes, big ints, non-finite floats, argparse.Namespace, torch.device and
                   dtypes, numpy RNG state; saved with pickle protocol 2 (torch's default:
                   synthetic_p2.pt) and 5 (synthetic_p5.pt, FRAME/MEMOIZE/STACK_GLOBAL/SHORT_BINUNICODE
                   ...), and a Transformer Engine style `_extra_state` (a BytesIO holding a torch.save).
  mcore_gpt2       megatron-core GPTModel, GPT-2 style (learned positions, LayerNorm, GeLU, biases, tied
                   embedding), float32, trained 2 steps with its DistributedOptimizer on one gloo rank,
                   saved as torch_dist (dist_checkpointing.save: iter_0000002/{.metadata,__0_0.distcp,
                   common.pt,metadata.json}) under torch_dist/, and in the legacy format under torch/
                   (iter_0000002/mp_rank_00/{model_optim_rng.pt,distrib_optim.pt}).
  mcore_llama      the same, Llama style: RoPE, RMSNorm, SwiGLU, no biases, untied output layer, GQA
                   (4 heads, 2 query groups), bfloat16 parameters with fp32 master weights.
  mcore_gpt2_tp2pp2  GPT-2 style at TP=2 x PP=2 (4 gloo processes, 1F1B schedule, one layer per stage),
                   torch_dist and legacy (mp_rank_0T_00P).
  mcore_llama_dp2  Llama style at DP=2 (2 processes): the distributed optimizer shards its state; torch_dist.
  ds_zero1, ds_zero2, ds_zero3   DeepSpeed (its CPU accelerator, 2 gloo processes, DP=2) training a
                   small GPT-like torch module 2 steps under ZeRO stage 1/2/3 with bf16 on and AdamW;
                   engine.save_checkpoint(): latest, global_step2/{mp_rank_00_model_states.pt,
                   [bf16_]zero_pp_rank_{0,1}_mp_rank_00_optim_states.pt} (ZeRO-3:
                   zero_pp_rank_{0,1}_mp_rank_00_model_states.pt); zero_to_fp32's
                   get_fp32_state_dict_from_zero_checkpoint() saved as zero_to_fp32.safetensors (the
                   reference weights), and ds_to_universal's conversion under universal/ (zero/<param>/
                   {fp32,exp_avg,exp_avg_sq,step}.pt). The zero_to_fp32.py that save_checkpoint copies
                   (and zero_to_torch.py) into the directory are removed (DeepSpeed's source, not data).
                   ds_to_universal runs with --inject_missing_state (plain DeepSpeed, not
                   Megatron-DeepSpeed, writes no universal_checkpoint_info).

Megatron-LM's training code (megatron/training) is not on PyPI: the legacy and torch_dist state
dicts are built here exactly as Megatron-LM's megatron/training/checkpointing.py builds them
(generate_state_dict(): 'args', 'checkpoint_version' 3.0, 'iteration', 'model' (state_dict_for_save_checkpoint()
or sharded_state_dict()), 'optimizer' (state_dict() or sharded_state_dict()), 'opt_param_scheduler',
'rerun_state_machine', 'rng_state' (get_rng_state(): a list of dicts; a ShardedObject 'rng_state'
under torch_dist), 'num_floating_point_operations_so_far'; save_checkpoint(): torch.save to
iter_{:07d}/mp_rank_{tp:02d}[_{pp:03d}]/model_optim_rng.pt, DistributedOptimizer.save_parameter_state()
to distrib_optim.pt beside it, dist_checkpointing.save(..., content_metadata=...) for torch_dist,
latest_checkpointed_iteration.txt). 'args' is an argparse.Namespace with the fields Megatron-LM's
parse_args gives for this run (a subset: the model, parallel, optimizer, schedule and checkpoint flags),
including params_dtype (a torch.dtype), attention_backend (megatron.core.transformer.enums.AttnBackend)
and model_type (megatron.core.enums.ModelType) as Megatron-LM sets them.

CPU shims (REFERENCES.md lists the first four): torch.cuda.current_device -> cpu; torch.cuda.synchronize
a no-op; the RNG tracker's fork a null context; an explicit causal mask; plus, for the optimizer,
device='cuda' in torch factory calls mapped to the CPU, Tensor.cuda() the identity, and Tensor.type()
reporting 'torch.cuda.*' names (megatron-core's optimizers check parameter types by those strings).
torch.cuda.get_rng_state() and the CUDA RNG tracker have no CPU equivalent: in rng_state,
'cuda_rng_state' and 'rng_tracker_states'['model-parallel-rng'] hold the CPU generator's ByteTensor in
their place (same type and role: an opaque uint8 tensor).

LISTING (ref.json): {"tool": ..., "versions": {...}, "files": [FILE...]} with FILE one of
  {"path": P, "kind": "torch_save", "root": TREE}               a torch.save zip (torch.load(weights_only=False))
  {"path": P, "kind": "pickle", "root": TREE}                   a plain pickle (torch_dist's .metadata)
  {"path": P, "kind": "distcp", "blobs": [{"key": FQN, "offset": O, "length": L, "index": I,
      "root": TREE}, ...]}                                       each storage item of the .metadata in this file
  {"path": P, "kind": "safetensors", "tensors": {name: TENSOR}} zero_to_fp32's output
  {"path": P, "kind": "text", "text": S}                        latest, latest_checkpointed_iteration.txt, metadata.json
and "dcp_metadata" (torch_dist dirs): {fqn: {"type": "tensor", "dtype", "size", "chunks": [{"offsets",
  "sizes", "file", "offset", "length"}]} | {"type": "bytes", "file", "offset", "length"}} from
  torch.distributed.checkpoint's own reader.
TREE, the value as the pickle builds it (mirroring how mpitron's reader represents it):
  null, true/false, integers (|x| < 2^63, else {"bigint": "decimal"}), floats (non-finite as
  {"float": "inf"|"-inf"|"nan"}), strings;
  {"bytes": n, "crc32": c, "hex": h (n <= 64)};
  {"list": [TREE...]}, {"tuple": [TREE...]} (torch.Size adds "type": "torch.Size"), {"set": [...], "frozen": b};
  {"dict": [[KEY, TREE]...]} in insertion order (OrderedDict adds "type": "collections.OrderedDict" and
  "state" when it has attributes, e.g. state_dict()'s _metadata);
  {"global": "module.name"} for classes, functions and torch dtypes/layouts/memory formats used as values;
  {"object": "module.name", "args": TREE, "state": TREE|absent} for any other object, from
  __reduce_ex__(protocol): the callable (copyreg.__newobj__'s class) and its arguments, and the state that
  BUILD receives;
  {"tensor": {"dtype": "float32"|..., "shape": [...], "stride": [...], "offset": storage offset (elements),
    "storage_bytes": n, "requires_grad": b, "parameter": b, "crc32": crc32 of the contiguous bytes,
    "norm": float64 2-norm, "samples": [[flat index, value as float64 (int for integer dtypes)]...]}}.
"""
import argparse
import contextlib
import copyreg
import enum
import io
import json
import math
import os
import pickle
import random
import shutil
import socket
import sys
import zlib
from collections import OrderedDict

import numpy as np
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "io", "ref", "torch")
SEQ, VOCAB, MBS, STEPS = 8, 32, 2, 2
HIDDEN, HEADS, KV_CHANNELS = 16, 4, 4


# ----------------------------------------------------------------------------------------------
# LISTING: the value tree as torch reads it
# ----------------------------------------------------------------------------------------------
def qualname(obj):
    return f"{obj.__module__}.{obj.__qualname__}"


def tensor_entry(t, parameter=False):
    c = t.detach().contiguous()
    raw = c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b""
    flat = c.reshape(-1)
    n = flat.numel()
    idx = sorted(set([0, n - 1, n // 2, n // 3, (7 * n) // 11]) if n else [])
    integer = not (c.dtype.is_floating_point)
    samples = []
    for i in idx:
        v = flat[i]
        samples.append([i, int(v.item()) if integer else float(v.double().item())])
    norm = float(c.double().norm().item()) if n else 0.0
    e = {"tensor": {
        "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "stride": list(t.stride()),
        "offset": t.storage_offset(), "storage_bytes": t.untyped_storage().nbytes(),
        "requires_grad": bool(t.requires_grad), "parameter": bool(parameter),
        "crc32": zlib.crc32(raw), "norm": fix_float(norm), "samples": [fix_float(s) for s in samples]}}
    if t.__dict__:  # Python attributes (e.g. DeepSpeed's ds_id): the state of _rebuild_from_type_v2
        e["tensor"]["attrs"] = tree(dict(t.__dict__))
    return e


def fix_float(x):
    if isinstance(x, float) and not math.isfinite(x):
        return {"float": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
    if isinstance(x, list):
        return [fix_float(v) for v in x]
    return x


def tree(v, protocol=2):
    t = lambda x: tree(x, protocol)  # noqa: E731
    if isinstance(v, enum.Enum):  # before int/str: an IntEnum pickles as its member, not as an int
        return reduced(v, protocol)
    if isinstance(v, pickle.PickleBuffer):  # protocol 5's in-band buffers are bytes
        v = bytes(v.raw())
    if v is None or isinstance(v, bool) or isinstance(v, str):
        return v
    if isinstance(v, int):
        return v if -(1 << 63) <= v < (1 << 63) else {"bigint": str(v)}
    if isinstance(v, float):
        return fix_float(v)
    if isinstance(v, (bytes, bytearray)):
        e = {"bytes": len(v), "crc32": zlib.crc32(bytes(v))}
        if len(v) <= 64:
            e["hex"] = bytes(v).hex()
        return e
    if isinstance(v, torch.Tensor):
        return tensor_entry(v, parameter=isinstance(v, torch.nn.Parameter))
    if isinstance(v, torch.Size):
        return {"tuple": [t(x) for x in v], "type": "torch.Size"}
    if isinstance(v, (torch.dtype, torch.layout, torch.memory_format)):
        return {"global": "torch." + str(v).split(".")[-1]}
    if type(v) is tuple:
        return {"tuple": [t(x) for x in v]}
    if type(v) is list:
        return {"list": [t(x) for x in v]}
    if type(v) in (set, frozenset):
        items = sorted((t(x) for x in v), key=lambda e: json.dumps(e, sort_keys=True))
        return {"set": items, "frozen": type(v) is frozenset}
    if type(v) is dict:
        return {"dict": [[t(k), t(x)] for k, x in v.items()]}
    if type(v) is OrderedDict:
        e = {"dict": [[t(k), t(x)] for k, x in v.items()], "type": "collections.OrderedDict"}
        if vars(v):
            e["state"] = t(vars(v))
        return e
    if isinstance(v, type) or callable(v) and hasattr(v, "__qualname__") and not hasattr(v, "__reduce_ex__"):
        return {"global": qualname(v)}
    if isinstance(v, type) or type(v).__name__ in ("function", "builtin_function_or_method"):
        return {"global": qualname(v)}
    return reduced(v, protocol)


def reduced(v, protocol):
    """An object as pickle writes it: the callable of __reduce_ex__(protocol), its args and state."""
    t = lambda x: tree(x, protocol)  # noqa: E731
    rv = v.__reduce_ex__(protocol)
    if isinstance(rv, str):  # a module-level singleton pickled by name
        return {"global": f"{type(v).__module__}.{rv}"}
    fn, args = rv[0], rv[1]
    state = rv[2] if len(rv) > 2 else None
    if fn is copyreg.__newobj__:
        fn, args = args[0], args[1:]
    elif fn is copyreg.__newobj_ex__:
        fn, args = args[0], args[1]
    e = {"object": qualname(fn), "args": t(tuple(args))}
    if state is not None:
        e["state"] = t(state)
    if len(rv) > 3 and (rv[3] is not None or (len(rv) > 4 and rv[4] is not None)):
        raise RuntimeError(f"listing of {qualname(fn)} with list/dict items is not supported")
    return e


def pickle_protocol(path):
    """The protocol of a torch.save file's data.pkl (its PROTO opcode)."""
    import zipfile
    with zipfile.ZipFile(path) as z:
        name = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
        head = z.read(name)[:2]
    return head[1] if head[0] == 0x80 else 0


def list_torch_save(path, base):
    root = torch.load(path, map_location="cpu", weights_only=False)
    return {"path": os.path.relpath(path, base), "kind": "torch_save", "root": tree(root, pickle_protocol(path))}


def list_dcp(ckpt_dir, base, metadata_tree=True):
    """The .metadata pickle (its whole tree only when metadata_tree: it is large), every .distcp storage
    item, common.pt and metadata.json of a torch_dist dir."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
    files = []
    mpath = os.path.join(ckpt_dir, ".metadata")
    with open(mpath, "rb") as f:
        md = pickle.load(f)
    files.append({"path": os.path.relpath(mpath, base), "kind": "pickle",
                  "root": tree(md, protocol=4) if metadata_tree else None})
    reader = FileSystemReader(ckpt_dir)
    md2 = reader.read_metadata()
    storage = md2.storage_data
    blobs = {}
    for idx, info in storage.items():
        with open(os.path.join(ckpt_dir, info.relative_path), "rb") as f:
            f.seek(info.offset)
            data = f.read(info.length)
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        blobs.setdefault(info.relative_path, []).append({
            "key": idx.fqn, "offset": info.offset, "length": info.length,
            "index": idx.index, "chunk_offset": list(idx.offset) if idx.offset is not None else None,
            "root": tree(obj)})
    for rel in sorted(blobs):
        files.append({"path": os.path.relpath(os.path.join(ckpt_dir, rel), base), "kind": "distcp",
                      "blobs": sorted(blobs[rel], key=lambda b: b["offset"])})
    dcp = {}
    for fqn, m in md2.state_dict_metadata.items():
        if isinstance(m, TensorStorageMetadata):
            chunks = []
            for i, ch in enumerate(m.chunks):
                info = None
                for idx, si in storage.items():
                    if idx.fqn == fqn and list(idx.offset) == list(ch.offsets):
                        info = si
                chunks.append({"offsets": list(ch.offsets), "sizes": list(ch.sizes),
                               "file": info.relative_path, "offset": info.offset, "length": info.length})
            dcp[fqn] = {"type": "tensor", "dtype": str(m.properties.dtype).replace("torch.", ""),
                        "size": list(m.size), "chunks": chunks}
        else:
            assert isinstance(m, BytesStorageMetadata)
            (info,) = [si for idx, si in storage.items() if idx.fqn == fqn]
            dcp[fqn] = {"type": "bytes", "file": info.relative_path, "offset": info.offset,
                        "length": info.length}
    common = os.path.join(ckpt_dir, "common.pt")
    if os.path.exists(common):
        files.append(list_torch_save(common, base))
    mj = os.path.join(ckpt_dir, "metadata.json")
    if os.path.exists(mj):
        files.append({"path": os.path.relpath(mj, base), "kind": "text", "text": open(mj).read()})
    return files, {os.path.relpath(ckpt_dir, base): dcp}


def list_dir(base, metadata_tree=True):
    """Every file under base: torch_save zips, torch_dist dirs, text files, safetensors."""
    files, dcp = [], {}
    for dirpath, dirnames, filenames in sorted(os.walk(base)):
        dirnames.sort()
        if ".metadata" in filenames:
            f, d = list_dcp(dirpath, base, metadata_tree)
            files += f
            dcp.update(d)
            continue
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, base)
            if name == "ref.json":
                continue
            if name.endswith((".pt", ".bin")):
                files.append(list_torch_save(p, base))
            elif name.endswith(".safetensors"):
                from safetensors.torch import load_file
                st = load_file(p)
                files.append({"path": rel, "kind": "safetensors",
                              "tensors": {k: tensor_entry(v) for k, v in sorted(st.items())}})
            else:
                files.append({"path": rel, "kind": "text", "text": open(p).read()})
    return files, dcp


def write_listing(base, tool, notes=None, metadata_tree=True):
    files, dcp = list_dir(base, metadata_tree)
    out = {"tool": tool, "versions": versions(), "files": files}
    if dcp:
        out["dcp_metadata"] = dcp
    if notes:
        out["notes"] = notes
    with open(os.path.join(base, "ref.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"), allow_nan=False)
        f.write("\n")


def versions():
    v = {"torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0]}
    try:
        import megatron.core
        v["megatron-core"] = megatron.core.__version__
    except Exception:
        pass
    try:
        import deepspeed
        v["deepspeed"] = deepspeed.__version__
    except Exception:
        pass
    return v


# ----------------------------------------------------------------------------------------------
# synthetic: every dtype and pickle feature torch.save writes
# ----------------------------------------------------------------------------------------------
def synthetic(out):
    g = torch.Generator().manual_seed(7)
    base = torch.randn(6, 10, generator=g)
    shared = torch.arange(40, dtype=torch.float32)
    sd = OrderedDict()
    sd["w"] = torch.nn.Parameter(torch.randn(5, 3, generator=g))
    sd["b"] = torch.randn(3, generator=g)
    sd._metadata = OrderedDict([("", {"version": 1})])
    dtypes = {}
    for dt in [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
               torch.float8_e5m2, torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]:
        name = str(dt).replace("torch.", "")
        if dt.is_floating_point:
            x = (torch.randn(4, 7, generator=g) * 3)
            x[0, 0], x[0, 1], x[0, 2] = 0.0, -0.0, 1e-3
            if dt not in (torch.float8_e4m3fn,):
                x[1, 0], x[1, 1] = float("inf"), float("-inf")
            dtypes[name] = x.to(dt)
        elif dt == torch.bool:
            dtypes[name] = torch.rand(4, 7, generator=g) > 0.5
        else:
            info = torch.iinfo(dt)
            x = torch.randint(max(info.min, -1000), min(info.max, 1000), (4, 7), generator=g).to(dt)
            x[0, 0], x[0, 1] = info.min, info.max
            dtypes[name] = x
    # a NaN in f8 e4m3fn (its one NaN pattern family; no infinities)
    dtypes["float8_e4m3fn"][1, 0] = float("nan")
    pws = torch.nn.Parameter(torch.randn(2, 2, generator=g))  # pickled by _rebuild_parameter_with_state
    pws.tensor_model_parallel, pws.partition_dim = True, 0
    te = io.BytesIO()
    torch.save(torch.frombuffer(bytearray(b"fp8 meta \x00\x01"), dtype=torch.uint8), te)
    te.seek(0)
    ns = argparse.Namespace(num_layers=2, hidden_size=32, lr=3e-4, bf16=True, params_dtype=torch.bfloat16,
                            tokenizer_type="GPT2BPETokenizer", data_path=["a", "b"], seed=1234)
    np_state = np.random.RandomState(5).get_state()
    root = {
        "dtypes": dtypes,
        "state_dict": sd,
        "views": {
            "base": base,
            "row": base[2],                     # offset 20
            "cols": base[:, 3:7],               # stride (10, 1), offset 3
            "transposed": base.t(),             # stride (1, 10)
            "every_other": base[::2, 1::3],     # stride (20, 3), offset 1
            "scalar": base[4, 5],               # 0-d view
            "shared_a": shared[:20].view(4, 5),  # two tensors on one storage
            "shared_b": shared[20:].view(5, 4),
            "empty": torch.zeros(0, 3),
            "expanded": torch.tensor([1.0, 2.0]).expand(3, 2),  # stride (0, 1)
        },
        "scalars": [None, True, False, 0, -1, 255, 65536, -(2 ** 31), 2 ** 63 - 1, 2 ** 64 + 5, -(2 ** 70),
                    1.5, -0.0, float("inf"), float("nan"), "", "ünïcødé ✓", b"", b"\x00\xffbytes" * 3],
        "containers": {
            "tuple0": (), "tuple1": (1,), "tuple2": (1, "a"), "tuple3": (1, 2, 3), "tuple5": (1, 2, 3, 4, 5),
            "set": {3, 1, 2}, "frozenset": frozenset({"x"}), "size": torch.Size([2, 3, 4]),
            "nested": [[[[{"deep": (1, [2, {3: 4}])}]]]],
            "int_keys": {0: "a", 1: "b", -5: "c"}, "tuple_keys": {(1, 2): "t", None: "n", 2.5: "f"},
            "long_list": list(range(2500)),  # more than one APPENDS batch (1000)
            "repeated": [sd["b"], sd["b"]],  # the same tensor twice (memo)
        },
        "objects": {"args": ns, "device": torch.device("cpu"), "cuda_device": torch.device("cuda", 1),
                    "dtype": torch.float8_e5m2, "np_rng_state": np_state, "py_rng_state": random.Random(3).getstate()},
        "layer.self_attention.core_attention._extra_state": te,
        "param_with_state": pws,
    }
    for proto in (2, 5):
        torch.save(root, os.path.join(out, f"synthetic_p{proto}.pt"), pickle_protocol=proto)
    write_listing(out, "torch.save (synthetic value tree; protocols 2 and 5)")


# ----------------------------------------------------------------------------------------------
# megatron-core
# ----------------------------------------------------------------------------------------------
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_shims():
    """What megatron-core 0.16.1 needs to train and save on a CPU (see the module docstring)."""
    def cpu_device(fn):
        def w(*a, **k):
            d = k.get("device")
            if d is not None and "cuda" in str(d):
                k["device"] = "cpu"
            return fn(*a, **k)
        return w
    for n in ["tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "empty_like", "ones_like"]:
        setattr(torch, n, cpu_device(getattr(torch, n)))
    tensor_type = torch.Tensor.type

    def cuda_type_name(self, *a, **k):
        r = tensor_type(self, *a, **k)
        return r.replace("torch.", "torch.cuda.", 1) if not a and not k and isinstance(r, str) else r
    torch.Tensor.type = cuda_type_name
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda *a, **k: None


MCORE_VARIANTS = {
    # name: (style, tp, pp, dp, layers)
    "mcore_gpt2": ("gpt2", 1, 1, 1, 2),
    "mcore_llama": ("llama", 1, 1, 1, 2),
    "mcore_gpt2_tp2pp2": ("gpt2", 2, 2, 1, 2),
    "mcore_llama_dp2": ("llama", 1, 1, 2, 2),
}


LEGACY_TOO = ("mcore_gpt2", "mcore_llama", "mcore_gpt2_tp2pp2")  # also saved in the legacy format
FULL_METADATA_TREE = ("mcore_llama",)  # ref.json lists .metadata's whole tree (else a summary: it is large)


def megatron_args(style, tp, pp, dp, layers, save_dir, ckpt_format):
    """argparse.Namespace with the fields Megatron-LM's parse_args() gives such a run (a subset)."""
    from megatron.core.enums import ModelType
    from megatron.core.transformer.enums import AttnBackend
    llama = style == "llama"
    gbs = MBS * dp * 2
    return argparse.Namespace(
        num_layers=layers, hidden_size=HIDDEN, ffn_hidden_size=32 if llama else 64, num_attention_heads=HEADS,
        group_query_attention=llama, num_query_groups=2 if llama else HEADS, kv_channels=KV_CHANNELS,
        max_position_embeddings=SEQ, seq_length=SEQ, position_embedding_type="rope" if llama else "learned_absolute",
        rotary_base=10000, rotary_percent=1.0, normalization="RMSNorm" if llama else "LayerNorm",
        norm_epsilon=1e-5, swiglu=llama, add_bias_linear=not llama, add_qkv_bias=not llama,
        untie_embeddings_and_output_weights=llama, hidden_dropout=0.0, attention_dropout=0.0,
        vocab_size=VOCAB, padded_vocab_size=VOCAB, make_vocab_size_divisible_by=VOCAB // tp,
        tokenizer_type="NullTokenizer", tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=None, context_parallel_size=1, expert_model_parallel_size=1,
        sequence_parallel=False, data_parallel_size=dp, world_size=tp * pp * dp, rank=0,
        micro_batch_size=MBS, global_batch_size=gbs, train_iters=STEPS, lr=1e-3, min_lr=1e-4,
        lr_decay_style="cosine", lr_warmup_iters=1, lr_decay_iters=STEPS, weight_decay=0.01,
        start_weight_decay=0.01, end_weight_decay=0.01, weight_decay_incr_style="constant",
        adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8, clip_grad=1.0, optimizer="adam",
        bf16=llama, fp16=False, params_dtype=torch.bfloat16 if llama else torch.float32,
        use_distributed_optimizer=True, ckpt_format=ckpt_format, use_dist_ckpt=ckpt_format != "torch",
        save=save_dir, load=None, save_interval=STEPS, seed=1234, consumed_train_samples=STEPS * gbs,
        consumed_valid_samples=0, skipped_train_samples=0, no_save_optim=None, no_save_rng=None,
        data_parallel_random_init=False, transformer_impl="local", attention_backend=AttnBackend.auto,
        model_type=ModelType.encoder_or_decoder, iteration=STEPS, curr_iteration=STEPS,
        num_floating_point_operations_so_far=0, data_path=None, split="969,30,1",
        init_method_std=0.02, use_cpu_initialization=True)


def mcore_worker(rank, name, out, port):
    style, tp, pp, dp, layers = MCORE_VARIANTS[name]
    world = tp * pp * dp
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    cpu_shims()
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
    dtype = torch.bfloat16 if llama else torch.float32
    torch.manual_seed(1234 + 100 * parallel_state.get_pipeline_model_parallel_rank())
    cfg = TransformerConfig(
        num_layers=layers, hidden_size=HIDDEN, ffn_hidden_size=32 if llama else 64, num_attention_heads=HEADS,
        num_query_groups=2 if llama else None, kv_channels=KV_CHANNELS, normalization="RMSNorm" if llama else "LayerNorm",
        gated_linear_unit=llama, activation_func=F.silu if llama else F.gelu, add_bias_linear=not llama,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True, bf16=llama,
        params_dtype=dtype, pipeline_dtype=dtype, tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp, batch_p2p_comm=False, init_method_std=0.02)
    model = GPTModel(
        config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization=cfg.normalization),
        vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope" if llama else "learned_absolute",
        share_embeddings_and_output_weights=not llama,
        pre_process=parallel_state.is_pipeline_first_stage(), post_process=parallel_state.is_pipeline_last_stage())
    if llama:
        model = model.to(torch.bfloat16)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(
        use_distributed_optimizer=True, grad_reduce_in_fp32=True), model)
    opt = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=1e-3, min_lr=1e-4, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.95,
        adam_eps=1e-8, clip_grad=1.0, bf16=llama, params_dtype=dtype, use_distributed_optimizer=True), [ddp])
    args = megatron_args(style, tp, pp, dp, layers, out, "torch")
    sched = OptimizerParamScheduler(opt, init_lr=0.0, max_lr=1e-3, min_lr=1e-4, lr_warmup_steps=1 * args.global_batch_size,
                                    lr_decay_steps=STEPS * args.global_batch_size, lr_decay_style="cosine",
                                    start_wd=0.01, end_wd=0.01, wd_incr_steps=STEPS * args.global_batch_size,
                                    wd_incr_style="constant")
    cfg.finalize_model_grads_func = finalize_model_grads
    mask = torch.triu(torch.ones(1, 1, SEQ, SEQ), 1).bool()
    dp_rank = parallel_state.get_data_parallel_rank()
    nmicro = args.global_batch_size // (MBS * dp)

    def batches(step):
        g = torch.Generator().manual_seed(1000 * step + dp_rank)
        for _ in range(nmicro):
            ids = torch.randint(0, VOCAB, (MBS, SEQ + 1), generator=g)
            yield ids[:, :-1], ids[:, 1:]

    def forward_step(data_iterator, m):
        ids, labels = next(data_iterator)
        pos = torch.arange(SEQ).unsqueeze(0).expand(MBS, SEQ)
        out_t = m(ids, pos, mask, labels=labels)

        def loss_func(o):
            loss = o.float().mean()
            return loss, {"lm loss": loss.detach().clone()}  # the schedule divides loss in place
        return out_t, loss_func

    fb = get_forward_backward_func()
    losses = []
    for step in range(STEPS):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        res = fb(forward_step_func=forward_step, data_iterator=batches(step), model=[ddp], num_microbatches=nmicro,
                 seq_length=SEQ, micro_batch_size=MBS, forward_only=False)
        ok, gnorm, _ = opt.step()
        assert ok
        sched.step(increment=args.global_batch_size)
        if res:
            losses.append(float(torch.stack([r["lm loss"] for r in res]).mean()))

    iteration = STEPS
    tpr, ppr = parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_rank()
    random.seed(1234 + rank)
    np.random.seed(1234 + rank)

    def rng_state():  # Megatron-LM checkpointing.get_rng_state(), CPU stand-ins for the CUDA states
        return [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                 "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.get_rng_state(),
                 "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()}}]

    def common(state_dict, fmt):
        a = megatron_args(style, tp, pp, dp, layers, out, fmt)
        a.rank = rank
        state_dict["args"] = a
        state_dict["checkpoint_version"] = 3.0
        state_dict["iteration"] = iteration
        state_dict["opt_param_scheduler"] = sched.state_dict()
        state_dict["rerun_state_machine"] = get_rerun_state_machine().state_dict(data_iterator=None, ckpt_format=fmt)
        state_dict["num_floating_point_operations_so_far"] = 0
        return state_dict

    # torch_dist (Megatron-LM: args.ckpt_format torch_dist, the default)
    tdir = os.path.join(out, "torch_dist")
    cdir = os.path.join(tdir, f"iter_{iteration:07d}")
    if rank == 0:
        os.makedirs(cdir, exist_ok=True)
    dist.barrier()
    md = {"distrib_optim_sharding_type": "dp_reshardable", "singleton_local_shards": False,
          "chained_optim_avoid_prefix": True,
          "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    sd = {}
    sd["model"] = model.sharded_state_dict(metadata=md)
    sd["optimizer"] = opt.sharded_state_dict(sd, metadata=md)
    common(sd, "torch_dist")
    sd["rng_state"] = ShardedObject("rng_state", rng_state(), (pp, tp), (ppr, tpr),
                                    replica_id=parallel_state.get_data_parallel_rank(with_context_parallel=True))
    dist_checkpointing.save(sd, cdir, content_metadata=_clean_metadata_for_serialization(md))
    dist.barrier()
    if rank == 0:
        with open(os.path.join(tdir, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(iteration))

    if name in LEGACY_TOO:
        # legacy torch format (Megatron-LM: --ckpt-format torch)
        ldir = os.path.join(out, "torch")
        mp = f"mp_rank_{tpr:02d}" if pp == 1 else f"mp_rank_{tpr:02d}_{ppr:03d}"
        path = os.path.join(ldir, f"iter_{iteration:07d}", mp, "model_optim_rng.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        opt.save_parameter_state(os.path.join(os.path.dirname(path), "distrib_optim.pt"))
        if dp_rank == 0:
            sd = common({}, "torch")
            sd["model"] = model.state_dict_for_save_checkpoint()
            sd["optimizer"] = opt.state_dict()
            sd["rng_state"] = rng_state()
            torch.save(sd, path)
        dist.barrier()
        if rank == 0:
            with open(os.path.join(ldir, "latest_checkpointed_iteration.txt"), "w") as f:
                f.write(str(iteration))
    if rank == world - 1:
        with open(os.path.join(out, f".losses_{rank}.json"), "w") as f:
            json.dump(losses, f)
    dist.barrier()
    dist.destroy_process_group()


def mcore(name, out):
    style, tp, pp, dp, layers = MCORE_VARIANTS[name]
    import torch.multiprocessing as mp
    mp.spawn(mcore_worker, args=(name, out, free_port()), nprocs=tp * pp * dp, join=True)
    losses = []
    for p in sorted(os.listdir(out)):
        if p.startswith(".losses_"):
            losses = json.load(open(os.path.join(out, p)))
            os.remove(os.path.join(out, p))
    write_listing(out, f"megatron-core GPTModel ({style}) TP={tp} PP={pp} DP={dp}, {layers} layers, "
                       f"distributed optimizer, {STEPS} steps",
                  notes={"losses": losses, "shims": "see tests/reference/torch_checkpoint_ref.py"},
                  metadata_tree=name in FULL_METADATA_TREE)


# ----------------------------------------------------------------------------------------------
# DeepSpeed
# ----------------------------------------------------------------------------------------------
class TinyGPT(torch.nn.Module):
    """A small GPT-like module: embedding, positions, one pre-LN block (attention + MLP), a head."""

    def __init__(self, vocab=VOCAB, c=HIDDEN, layers=1):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, c)
        self.wpe = torch.nn.Embedding(SEQ, c)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            b = torch.nn.Module()
            b.ln1, b.ln2 = torch.nn.LayerNorm(c), torch.nn.LayerNorm(c)
            b.qkv, b.proj = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, c)
            b.fc, b.out = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)
            self.blocks.append(b)
        self.ln_f = torch.nn.LayerNorm(c)
        self.head = torch.nn.Linear(c, vocab, bias=False)
        self.register_buffer("causal", torch.triu(torch.ones(SEQ, SEQ), 1).bool(), persistent=False)

    def forward(self, ids, labels):
        B, T = ids.shape
        x = self.wte(ids) + self.wpe(torch.arange(T))
        for b in self.blocks:
            q, k, v = b.qkv(b.ln1(x)).view(B, T, 3, HEADS, -1).unbind(2)
            a = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + b.proj(a.transpose(1, 2).reshape(B, T, -1))
            x = x + b.out(torch.nn.functional.gelu(b.fc(b.ln2(x))))
        logits = self.head(self.ln_f(x)).float()
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels.reshape(-1))


def ds_worker(rank, stage, out, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_SIZE="2")
    torch.set_num_threads(1)
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(1234)
    model = TinyGPT()
    cfg = {"train_micro_batch_size_per_gpu": MBS, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                     "weight_decay": 0.01, "torch_adam": True}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3,
                                                        "warmup_num_steps": 4}},
           "gradient_clipping": 1.0, "bf16": {"enabled": True},
           "zero_optimization": {"stage": stage}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        ids = torch.randint(0, VOCAB, (MBS, SEQ + 1), generator=g)
        loss = engine(ids[:, :-1], ids[:, 1:])
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    engine.save_checkpoint(out)
    if rank == 0:
        with open(os.path.join(out, ".losses.json"), "w") as f:
            json.dump(losses, f)


def ds(stage, out):
    import torch.multiprocessing as mp
    mp.spawn(ds_worker, args=(stage, out, free_port()), nprocs=2, join=True)
    losses = json.load(open(os.path.join(out, ".losses.json")))
    os.remove(os.path.join(out, ".losses.json"))
    for script in ("zero_to_fp32.py", "zero_to_torch.py"):  # DeepSpeed's own scripts, copied by save_checkpoint
        if os.path.exists(os.path.join(out, script)):
            os.remove(os.path.join(out, script))
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import save_file
    sd = get_fp32_state_dict_from_zero_checkpoint(out)
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(out, "zero_to_fp32.safetensors"))
    uni = ds_universal(out)
    write_listing(out, f"DeepSpeed ZeRO-{stage}, 2 gloo ranks (CPU accelerator), bf16, AdamW, {STEPS} steps",
                  notes={"losses_rank0": losses, "universal": uni.replace(out + "/", "")})


def ds_universal(out):
    """DeepSpeed's ds_to_universal conversion of global_step2 into universal/ (on the CPU)."""
    from deepspeed.checkpoint import ds_to_universal
    tag = open(os.path.join(out, "latest")).read().strip()
    argv = ["ds_to_universal", "--input_folder", os.path.join(out, tag),
            "--output_folder", os.path.join(out, "universal"), "--num_extract_workers", "1",
            "--num_merge_workers", "1", "--no_strict", "--inject_missing_state"]
    old = sys.argv
    try:
        sys.argv = argv
        ds_to_universal.main(ds_to_universal.parse_arguments())
        return "ds_to_universal: " + " ".join(argv[1:])
    except Exception as e:  # recorded, not hidden
        shutil.rmtree(os.path.join(out, "universal"), ignore_errors=True)
        return f"ds_to_universal failed on this CPU: {type(e).__name__}: {e}"
    finally:
        sys.argv = old


# ----------------------------------------------------------------------------------------------
NAMES = ["synthetic"] + list(MCORE_VARIANTS) + ["ds_zero1", "ds_zero2", "ds_zero3"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="*", default=NAMES, choices=NAMES)
    p.add_argument("--out", default=OUT)
    p.add_argument("--relist", action="store_true",
                   help="only rewrite each ref.json from the files already there (keeping its tool and notes)")
    a = p.parse_args()
    for name in a.only:
        if a.relist:
            out = os.path.join(a.out, name)
            old = json.load(open(os.path.join(out, "ref.json")))
            write_listing(out, old["tool"], old.get("notes"), metadata_tree=name in FULL_METADATA_TREE or
                          not name.startswith("mcore"))
            print(f"== {name}: relisted", flush=True)
            continue
        out = os.path.join(a.out, name)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        print(f"== {name}", flush=True)
        if name == "synthetic":
            synthetic(out)
        elif name.startswith("mcore"):
            mcore(name, out)
        else:
            ds(int(name[-1]), out)
        total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
        print(f"   {out}: {total} bytes", flush=True)


if __name__ == "__main__":
    main()
