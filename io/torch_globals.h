// io/torch_globals.h — the globals a checkpoint's pickle may name, and what
// REDUCE / NEWOBJ / BUILD on them build. Nothing here calls Python: every
// allowed global becomes data.
//
// The allow-list (names after Python 2's are mapped: __builtin__ -> builtins,
// copy_reg -> copyreg; each decided from the real files in tests/io/ref/torch):
//   tensors   torch._utils._rebuild_tensor, _rebuild_tensor_v2, _rebuild_tensor_v3,
//             _rebuild_parameter, _rebuild_parameter_with_state,
//             torch._tensor._rebuild_from_type_v2 (only around those, with type
//             torch.Tensor or torch.nn.parameter.Parameter; its state becomes the
//             tensor's attrs, e.g. DeepSpeed's ds_id)
//   storages  torch.{Float,Double,Half,BFloat16,Byte,Char,Short,Int,Long,Bool,
//             ComplexFloat,ComplexDouble}Storage (also torch.cuda.*),
//             torch.storage.UntypedStorage (float8 and unsigned types come this
//             way with _rebuild_tensor_v3's dtype): only inside a persistent id
//   values    torch dtypes (torch.float32, torch.float8_e4m3fn, ...), layouts
//             (torch.strided, ..., also via torch.serialization._get_layout),
//             memory formats, torch.Tensor, torch.nn.parameter.Parameter,
//             numpy.ndarray
//   builders  collections.OrderedDict (a dict), torch.Size (a tuple),
//             builtins.set / frozenset, builtins.bytes / bytearray,
//             _codecs.encode (latin-1 only: protocol 2's bytes), builtins.getattr
//             (only an allow-listed class and a name: how enums pickle)
//   opaque    objects kept as (class, args, state):
//             argparse.Namespace (attr() reads it like a dict), torch.device,
//             _io.BytesIO (Transformer Engine's _extra_state),
//             numpy.dtype, numpy.[_]core.multiarray._reconstruct / scalar,
//             numpy.[_]core.numeric._frombuffer (RNG states),
//             megatron.core.enums.ModelType, megatron.core.transformer.enums.
//             {AttnBackend, AttnMaskType, AttnType}, megatron.core.rerun_state_machine.RerunMode,
//             deepspeed.runtime.fp16.loss_scaler.{LossScaler, DynamicLossScaler},
//             deepspeed.runtime.zero.config.ZeroStageEnum,
//             deepspeed.utils.tensor_fragment.fragment_address,
//             torch.distributed.checkpoint.metadata.{Metadata, TensorStorageMetadata,
//             ChunkStorageMetadata, BytesStorageMetadata, MetadataIndex,
//             TensorProperties, StorageMeta, _MEM_FORMAT_ENCODING},
//             torch.distributed.checkpoint.filesystem._StorageInfo,
//             torch.distributed.checkpoint.planner.{SavePlan, WriteItem,
//             TensorWriteData, WriteItemType}
// Everything else is refused, naming the global.
#pragma once
#include <string>
#include <vector>

#include "io/torch_value.h"

namespace mpitron::io {

// The normalized dotted name of GLOBAL module/name, or a PickleFault naming it
// when it is not on the allow-list.
std::string torch_global_checked(const std::string& module, const std::string& name);

// REDUCE: callable(*args). NEWOBJ: cls.__new__(cls, *args). BUILD: target.__setstate__(state).
// Each returns or fills in the value that stands for the result; PickleFault when
// the global cannot be applied so.
PyPtr torch_global_reduce(const PyValue& callable, const PyPtr& args, int max_depth);
PyPtr torch_global_newobj(const PyValue& cls, const PyPtr& args, int max_depth);
void torch_global_build(PyValue& target, const PyPtr& state, int max_depth);

// The allow-list, sorted (for docs and tests).
std::vector<std::string> torch_global_allow_list();

}  // namespace mpitron::io
