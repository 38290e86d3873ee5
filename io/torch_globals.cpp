#include "io/torch_globals.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "io/torch_pickle.h"

namespace mpitron::io {

namespace {

enum class Role {
  Value,    // a constant used as data (dtypes, layouts, classes passed as arguments)
  Storage,  // a storage class: only inside a persistent id
  Class,    // kept as an opaque Object(name, args, state)
  OrderedDict,
  Size,
  Set,
  FrozenSet,
  Bytes,
  ByteArray,
  Encode,
  GetAttr,
  GetLayout,
  RebuildTensor,
  RebuildTensorV2,
  RebuildTensorV3,
  RebuildParameter,
  RebuildParameterWithState,
  RebuildFromTypeV2,
};

const std::unordered_map<std::string, Role>& table() {
  static const std::unordered_map<std::string, Role> t = [] {
    std::unordered_map<std::string, Role> m;
    for (const char* s : {"Float", "Double", "Half", "BFloat16", "Byte", "Char", "Short", "Int", "Long", "Bool",
                          "ComplexFloat", "ComplexDouble"}) {
      m[str("torch.", s, "Storage")] = Role::Storage;
      m[str("torch.cuda.", s, "Storage")] = Role::Storage;
    }
    m["torch.storage.UntypedStorage"] = Role::Storage;
    m["torch.UntypedStorage"] = Role::Storage;
    for (const char* s : {"float32",
                          "float",
                          "float64",
                          "double",
                          "float16",
                          "half",
                          "bfloat16",
                          "float8_e4m3fn",
                          "float8_e5m2",
                          "float8_e4m3fnuz",
                          "float8_e5m2fnuz",
                          "float8_e8m0fnu",
                          "bool",
                          "uint8",
                          "int8",
                          "int16",
                          "short",
                          "int32",
                          "int",
                          "int64",
                          "long",
                          "uint16",
                          "uint32",
                          "uint64",
                          "complex64",
                          "cfloat",
                          "complex128",
                          "cdouble",
                          "strided",
                          "sparse_coo",
                          "sparse_csr",
                          "contiguous_format",
                          "preserve_format",
                          "channels_last",
                          "channels_last_3d",
                          "Tensor"})
      m[str("torch.", s)] = Role::Value;
    m["torch.nn.parameter.Parameter"] = Role::Value;
    m["numpy.ndarray"] = Role::Value;
    for (const char* s :
         {"argparse.Namespace", "torch.device", "_io.BytesIO", "numpy.dtype", "numpy.core.multiarray._reconstruct",
          "numpy._core.multiarray._reconstruct", "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar",
          "numpy.core.numeric._frombuffer", "numpy._core.numeric._frombuffer",
          // Megatron-Core enums found in args (and the rerun state machine)
          "megatron.core.enums.ModelType", "megatron.core.transformer.enums.AttnBackend",
          "megatron.core.transformer.enums.AttnMaskType", "megatron.core.transformer.enums.AttnType",
          "megatron.core.rerun_state_machine.RerunMode",
          // DeepSpeed optimizer states
          "deepspeed.runtime.fp16.loss_scaler.LossScaler", "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
          "deepspeed.runtime.zero.config.ZeroStageEnum", "deepspeed.utils.tensor_fragment.fragment_address",
          // torch.distributed.checkpoint's .metadata (torch_dist)
          "torch.distributed.checkpoint.metadata.Metadata",
          "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
          "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
          "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
          "torch.distributed.checkpoint.metadata.MetadataIndex",
          "torch.distributed.checkpoint.metadata.TensorProperties", "torch.distributed.checkpoint.metadata.StorageMeta",
          "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
          "torch.distributed.checkpoint.filesystem._StorageInfo", "torch.distributed.checkpoint.planner.SavePlan",
          "torch.distributed.checkpoint.planner.WriteItem", "torch.distributed.checkpoint.planner.TensorWriteData",
          "torch.distributed.checkpoint.planner.WriteItemType"})
      m[s] = Role::Class;
    m["collections.OrderedDict"] = Role::OrderedDict;
    m["torch.Size"] = Role::Size;
    m["builtins.set"] = Role::Set;
    m["builtins.frozenset"] = Role::FrozenSet;
    m["builtins.bytes"] = Role::Bytes;
    m["builtins.bytearray"] = Role::ByteArray;
    m["_codecs.encode"] = Role::Encode;
    m["builtins.getattr"] = Role::GetAttr;
    m["torch.serialization._get_layout"] = Role::GetLayout;
    m["torch._utils._rebuild_tensor"] = Role::RebuildTensor;
    m["torch._utils._rebuild_tensor_v2"] = Role::RebuildTensorV2;
    m["torch._utils._rebuild_tensor_v3"] = Role::RebuildTensorV3;
    m["torch._utils._rebuild_parameter"] = Role::RebuildParameter;
    m["torch._utils._rebuild_parameter_with_state"] = Role::RebuildParameterWithState;
    m["torch._tensor._rebuild_from_type_v2"] = Role::RebuildFromTypeV2;
    return m;
  }();
  return t;
}

std::string printable(const std::string& s) {
  std::string o;
  for (unsigned char c : s.substr(0, 120)) o += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  return s.size() > 120 ? o + "..." : o;
}

Role role_of(const PyValue& g) {
  const auto it = table().find(g.type_name());
  if (it == table().end())
    throw PickleFault{str("global '", printable(g.type_name()), "' is not on the allow-list"), ""};
  return it->second;
}

[[noreturn]] void bad_args(const std::string& fn, const PyValue& args, const char* want) {
  throw PickleFault{str(fn, " expects ", want, ", got ", args.describe()), ""};
}

// ---- tensors --------------------------------------------------------------------------------------
constexpr int64_t kMaxDim = int64_t{1} << 62;

std::vector<int64_t> int_tuple(const PyValue& v, const char* what) {
  if (!v.is(PyKind::Tuple) && !v.is(PyKind::List))
    throw PickleFault{str("a tensor's ", what, " is a ", v.describe()), ""};
  if (v.items().size() > 64) throw PickleFault{str("a tensor with ", v.items().size(), " dimensions"), ""};
  std::vector<int64_t> out;
  for (const PyPtr& it : v.items()) {
    if (!it->is(PyKind::Int) || it->as_int() < 0 || it->as_int() > kMaxDim)
      throw PickleFault{str("a tensor's ", what, " holds ", it->describe(), " (not an int in [0, 2^62])"), ""};
    out.push_back(it->as_int());
  }
  return out;
}

// The tensor view storage[offset + Σ i_d·stride_d], checked to lie inside the storage.
TorchTensor make_tensor(const PyValue& storage, const PyValue& offset, const PyValue& size, const PyValue& stride,
                        const PyValue* dtype) {
  if (!storage.is(PyKind::Storage)) throw PickleFault{str("a tensor's storage is a ", storage.describe()), ""};
  TorchTensor t;
  t.storage = storage.storage();
  t.dtype = t.storage->dtype;
  if (dtype) {
    if (!dtype->is(PyKind::Global) || !torch_dtype_from_global(dtype->type_name(), t.dtype))
      throw PickleFault{str("a tensor's dtype is ", dtype->describe()), ""};
  }
  if (!offset.is(PyKind::Int) || offset.as_int() < 0 || offset.as_int() > kMaxDim)
    throw PickleFault{str("a tensor's storage offset is ", offset.describe()), ""};
  t.offset = offset.as_int();
  t.shape = int_tuple(size, "size");
  t.stride = int_tuple(stride, "stride");
  if (t.shape.size() != t.stride.size())
    throw PickleFault{str("a tensor has ", t.shape.size(), " sizes but ", t.stride.size(), " strides"), ""};
  const uint64_t es = torch_dtype_size(t.dtype);
  unsigned __int128 numel = 1, last = static_cast<unsigned __int128>(t.offset);
  for (size_t d = 0; d < t.shape.size(); ++d) {
    numel *= static_cast<unsigned __int128>(t.shape[d]);
    if (numel > kMaxDim) throw PickleFault{str("a tensor of more than 2^62 elements"), ""};
  }
  if (numel * es > kMaxDim) throw PickleFault{str("a tensor of more than 2^62 bytes"), ""};
  if (numel > 0) {
    for (size_t d = 0; d < t.shape.size(); ++d)
      last += static_cast<unsigned __int128>(t.shape[d] - 1) * static_cast<unsigned __int128>(t.stride[d]);
    if ((last + 1) * es > t.storage->nbytes)
      throw PickleFault{str("a tensor view ", t.describe(), " at offset ", t.offset, " reaches byte ",
                            static_cast<uint64_t>(std::min<unsigned __int128>((last + 1) * es, ~uint64_t{0})),
                            " of its storage '", printable(t.storage->key), "' of ", t.storage->nbytes, " bytes"),
                        ""};
  }
  return t;
}

const PyValue& arg(const PyValue& args, size_t i) { return *args.items()[i]; }

PyPtr rebuild(Role r, const std::string& fn, const PyValue& args) {
  const size_t n = args.items().size();
  switch (r) {
    case Role::RebuildTensor:  // (storage, offset, size, stride)
      if (n != 4) bad_args(fn, args, "4 arguments");
      return PyValue::tensor_value(make_tensor(arg(args, 0), arg(args, 1), arg(args, 2), arg(args, 3), nullptr));
    case Role::RebuildTensorV2:    // (storage, offset, size, stride, requires_grad, backward_hooks[, metadata])
    case Role::RebuildTensorV3: {  // (..., backward_hooks, dtype[, metadata])
      const size_t need = r == Role::RebuildTensorV2 ? 6 : 7;
      if (n != need && n != need + 1)
        bad_args(fn, args, r == Role::RebuildTensorV2 ? "6 or 7 arguments" : "7 or 8 arguments");
      TorchTensor t = make_tensor(arg(args, 0), arg(args, 1), arg(args, 2), arg(args, 3),
                                  r == Role::RebuildTensorV3 ? &arg(args, 6) : nullptr);
      if (!arg(args, 4).is(PyKind::Bool)) bad_args(fn, args, "requires_grad as a bool");
      t.requires_grad = arg(args, 4).as_bool();
      return PyValue::tensor_value(std::move(t));
    }
    case Role::RebuildParameter:             // (tensor, requires_grad, backward_hooks)
    case Role::RebuildParameterWithState: {  // (..., state)
      const size_t need = r == Role::RebuildParameter ? 3 : 4;
      if (n != need || !arg(args, 0).is_tensor() || !arg(args, 1).is(PyKind::Bool))
        bad_args(fn, args, r == Role::RebuildParameter ? "(tensor, bool, hooks)" : "(tensor, bool, hooks, state)");
      TorchTensor t = arg(args, 0).tensor();
      t.parameter = true;
      t.requires_grad = arg(args, 1).as_bool();
      if (r == Role::RebuildParameterWithState) {
        const PyPtr& st = args.items()[3];
        if (st->is_dict() && st->size() > 0)
          t.attrs = st;
        else if (st->is(PyKind::Tuple) && st->size() == 2 && st->items()[0]->is_dict() && st->items()[0]->size() > 0)
          t.attrs = st->items()[0];
      }
      return PyValue::tensor_value(std::move(t));
    }
    default: break;
  }
  throw PickleFault{str(fn, " is not a tensor builder"), ""};
}

PyPtr from_type_v2(const std::string& fn, const PyValue& args, int max_depth) {
  // (func, new_type, args, state): func(*args), then the tensor subclass and its Python state.
  if (args.items().size() != 4 || !arg(args, 0).is(PyKind::Global) || !arg(args, 1).is(PyKind::Global) ||
      !arg(args, 2).is(PyKind::Tuple))
    bad_args(fn, args, "(rebuild function, type, argument tuple, state)");
  const Role inner = role_of(arg(args, 0));
  if (inner < Role::RebuildTensor || inner == Role::RebuildFromTypeV2)
    throw PickleFault{str(fn, " around ", arg(args, 0).type_name(), ", not a tensor builder"), ""};
  const std::string& type = arg(args, 1).type_name();
  if (type != "torch.Tensor" && type != "torch.nn.parameter.Parameter")
    throw PickleFault{str(fn, " makes a '", printable(type), "', not a torch.Tensor or Parameter"), ""};
  PyPtr base = rebuild(inner, arg(args, 0).type_name(), arg(args, 2));
  TorchTensor t = base->tensor();
  t.parameter = t.parameter || type == "torch.nn.parameter.Parameter";
  const PyPtr& st = args.items()[3];
  if (st->is_dict() && st->size() > 0)
    t.attrs = st;
  else if (st->is(PyKind::Tuple) && st->size() == 2 && st->items()[0]->is_dict() && st->items()[0]->size() > 0)
    t.attrs = st->items()[0];
  PyMut out = PyValue::tensor_value(std::move(t));
  if (out->depth() > max_depth) throw PickleFault{str("values are nested deeper than ", max_depth, " levels"), ""};
  return out;
}

// ---- plain builders -------------------------------------------------------------------------------
void fill_from_iterable(const PyMut& target, const PyValue& src, int max_depth, bool pairs) {
  if (!src.is(PyKind::List) && !src.is(PyKind::Tuple) && !src.is(PyKind::Set))
    throw PickleFault{str("expected a list or tuple of items, got ", src.describe()), ""};
  for (const PyPtr& it : src.items()) {
    if (!pairs) {
      target->add(it, max_depth);
      continue;
    }
    if (!it->is(PyKind::Tuple) && !it->is(PyKind::List))
      throw PickleFault{str("a dict item is a ", it->describe()), ""};
    if (it->items().size() != 2) throw PickleFault{str("a dict item has ", it->items().size(), " parts, not 2"), ""};
    target->set_item(it->items()[0], it->items()[1], max_depth);
  }
}

// A str's UTF-8 as latin-1 bytes (each code point < 256), as _codecs.encode(s, "latin1") makes them.
std::string latin1(const std::string& utf8) {
  std::string out;
  for (size_t i = 0; i < utf8.size(); ++i) {
    const auto c = static_cast<unsigned char>(utf8[i]);
    if (c < 0x80)
      out += static_cast<char>(c);
    else if ((c & 0xe0) == 0xc0 && c <= 0xc3 && i + 1 < utf8.size() && (utf8[i + 1] & 0xc0) == 0x80)
      out += static_cast<char>(((c & 0x1f) << 6) | (utf8[++i] & 0x3f));
    else
      throw PickleFault{"_codecs.encode of a string with characters beyond latin-1", ""};
  }
  return out;
}

}  // namespace

std::string torch_global_checked(const std::string& module, const std::string& name) {
  std::string m = module;
  if (m == "__builtin__")
    m = "builtins";  // Python 2 names, as pickle's fix_imports maps them
  else if (m == "copy_reg")
    m = "copyreg";
  const std::string full = m + "." + name;
  if (!table().count(full))
    throw PickleFault{str("global '", printable(full), "' is not on the allow-list: refused, never executed"),
                      "mpitron reads tensors and plain data from checkpoints, never code; a checkpoint that needs this "
                      "global is either hostile or holds a class mpitron does not know (see io/torch_globals.h)"};
  return full;
}

PyPtr torch_global_reduce(const PyValue& callable, const PyPtr& args_ptr, int max_depth) {
  const std::string& fn = callable.type_name();
  const PyValue& args = *args_ptr;
  const size_t n = args.items().size();
  const Role r = role_of(callable);
  switch (r) {
    case Role::Class: return PyValue::object(fn, args_ptr);
    case Role::OrderedDict: {
      PyMut d = PyValue::dict("collections.OrderedDict");
      if (n == 1)
        fill_from_iterable(d, arg(args, 0), max_depth, true);
      else if (n != 0)
        bad_args(fn, args, "() or (items,)");
      return d;
    }
    case Role::Size: {
      if (n != 1 || !arg(args, 0).is(PyKind::Tuple)) bad_args(fn, args, "(tuple of ints,)");
      for (const PyPtr& it : arg(args, 0).items())
        if (!it->is(PyKind::Int)) bad_args(fn, args, "(tuple of ints,)");
      return PyValue::tuple(arg(args, 0).items(), "torch.Size");
    }
    case Role::Set:
    case Role::FrozenSet: {
      PyMut s = PyValue::set(r == Role::FrozenSet ? "frozenset" : "");
      if (n == 1)
        fill_from_iterable(s, arg(args, 0), max_depth, false);
      else if (n != 0)
        bad_args(fn, args, "() or (items,)");
      return s;
    }
    case Role::Bytes:
    case Role::ByteArray: {
      const std::string type = r == Role::ByteArray ? "bytearray" : "";
      if (n == 0) return PyValue::bytes("", type);
      if (n == 1 && arg(args, 0).is(PyKind::Bytes)) return PyValue::bytes(arg(args, 0).as_bytes(), type);
      if (n == 1 && arg(args, 0).is(PyKind::List)) {
        std::string b;
        for (const PyPtr& it : arg(args, 0).items()) {
          if (!it->is(PyKind::Int) || it->as_int() < 0 || it->as_int() > 255) bad_args(fn, args, "a list of bytes");
          b += static_cast<char>(it->as_int());
        }
        return PyValue::bytes(std::move(b), type);
      }
      if (n == 2 && arg(args, 0).is(PyKind::Str) && arg(args, 1).is(PyKind::Str) &&
          (arg(args, 1).as_str() == "latin-1" || arg(args, 1).as_str() == "latin1"))
        return PyValue::bytes(latin1(arg(args, 0).as_str()), type);
      bad_args(fn, args, "(), (bytes,), (list of ints,) or (str, 'latin-1')");
    }
    case Role::Encode:
      if (n != 2 || !arg(args, 0).is(PyKind::Str) || !arg(args, 1).is(PyKind::Str) ||
          (arg(args, 1).as_str() != "latin1" && arg(args, 1).as_str() != "latin-1"))
        bad_args(fn, args, "(str, 'latin1')");
      return PyValue::bytes(latin1(arg(args, 0).as_str()));
    case Role::GetAttr:
      // Only an allow-listed class's member by name: how Python 3.11+ pickles an enum member.
      if (n != 2 || !arg(args, 0).is(PyKind::Global) || !arg(args, 1).is(PyKind::Str))
        bad_args(fn, args, "(allow-listed class, name)");
      if (role_of(arg(args, 0)) != Role::Class)
        throw PickleFault{
            str("getattr on '", printable(arg(args, 0).type_name()), "' is refused (only on an allow-listed class)"),
            ""};
      return PyValue::object(fn, args_ptr);
    case Role::GetLayout: {
      if (n != 1 || !arg(args, 0).is(PyKind::Str)) bad_args(fn, args, "('torch.<layout>',)");
      const std::string& name = arg(args, 0).as_str();
      const auto it = table().find(name);
      if (name.rfind("torch.", 0) != 0 || it == table().end() || it->second != Role::Value)
        throw PickleFault{str("layout '", printable(name), "' is not a known torch layout"), ""};
      return PyValue::global(name);
    }
    case Role::RebuildTensor:
    case Role::RebuildTensorV2:
    case Role::RebuildTensorV3:
    case Role::RebuildParameter:
    case Role::RebuildParameterWithState: return rebuild(r, fn, args);
    case Role::RebuildFromTypeV2: return from_type_v2(fn, args, max_depth);
    case Role::Value:
    case Role::Storage: break;
  }
  throw PickleFault{str("'", fn, "' is data, not something a pickle may call"), ""};
}

PyPtr torch_global_newobj(const PyValue& cls, const PyPtr& args, int max_depth) {
  const Role r = role_of(cls);
  if (r == Role::Class) return PyValue::object(cls.type_name(), args);
  if (r == Role::OrderedDict || r == Role::Set || r == Role::FrozenSet)
    return torch_global_reduce(cls, args, max_depth);
  throw PickleFault{str("NEWOBJ of '", cls.type_name(), "' is refused (not a class kept as data)"), ""};
}

void torch_global_build(PyValue& target, const PyPtr& state, int max_depth) {
  if (target.is(PyKind::Object) || (target.is_dict() && target.type_name() == "collections.OrderedDict")) {
    target.set_state(state, max_depth);
    return;
  }
  throw PickleFault{str("BUILD on a ", target.describe(), " is refused"), ""};
}

std::vector<std::string> torch_global_allow_list() {
  std::vector<std::string> v;
  for (const auto& [k, r] : table()) v.push_back(k);
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace mpitron::io
