// io/torch_value.h — the value tree an unpickled torch.save file becomes.
//
// A small model of the Python objects a checkpoint holds, never Python itself:
//   None, bool, int (int64; larger ones as BigInt, kept in decimal), float,
//   str (UTF-8 bytes as the pickle gave them), bytes (also bytearray),
//   list, tuple (torch.Size is a tuple with type_name "torch.Size"),
//   set (frozenset: type_name "frozenset"), dict (any hashable keys, in
//   insertion order; collections.OrderedDict has type_name
//   "collections.OrderedDict" and may carry a state, e.g. state_dict()'s
//   _metadata), Global (a class, function or constant named by the pickle:
//   "torch.float32", "numpy.ndarray"), Object (an allow-listed class or
//   callable applied to args, with the state BUILD gave it: argparse.Namespace,
//   enums, dataclasses, numpy arrays, ... all opaque), Storage (a torch storage
//   record) and Tensor (a lazy view of a storage: nothing is read until asked).
//
// Values are shared (a pickle's memo can name one value twice: the tree is a
// DAG) and immutable once unpickled. The unpickler guarantees: no cycles, a
// nesting depth below its limit (so recursive walks are safe), and every
// tensor view inside its storage record.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "io/torch_dtype.h"

namespace mpitron::io {

class PyValue;
using PyPtr = std::shared_ptr<const PyValue>;
using PyMut = std::shared_ptr<PyValue>;

enum class PyKind : uint8_t {
  None,
  Bool,
  Int,
  BigInt,
  Float,
  Str,
  Bytes,
  List,
  Tuple,
  Set,
  Dict,
  Global,
  Object,
  Storage,
  Tensor
};
const char* py_kind_name(PyKind k);

// One storage record of a torch.save archive: `<archive>/data/<key>`.
struct TorchStorage {
  std::string key;        // the record's key ("0", "17", ...)
  std::string type_name;  // "torch.FloatStorage", "torch.storage.UntypedStorage", ...
  TorchDType dtype;       // of its elements (UntypedStorage: U8, bytes)
  uint64_t nbytes = 0;    // as the persistent id declares (numel · element size)
  std::string location;   // "cpu", "cuda:0", ... (informational: data is read to the host)
};

// A tensor: a strided view of a storage, read lazily (io/torch_checkpoint.h).
//   element (i0, ..., ik) lies at storage element offset + Σ i_d · stride[d]
//   of `dtype` (for a typed storage, the storage's own type).
struct TorchTensor {
  std::shared_ptr<const TorchStorage> storage;
  TorchDType dtype = TorchDType::F32;
  int64_t offset = 0;           // in elements of dtype
  std::vector<int64_t> shape;   // {} for a 0-d tensor
  std::vector<int64_t> stride;  // in elements; same length as shape
  bool requires_grad = false;
  bool parameter = false;  // rebuilt as a torch.nn.Parameter
  PyPtr attrs;             // Python attributes it carried (a dict), or null
  int64_t numel() const;
  bool contiguous() const;  // row-major without gaps
  size_t nbytes() const { return static_cast<size_t>(numel()) * torch_dtype_size(dtype); }
  std::string describe() const;  // "bfloat16[32, 16]"
};

class PyValue {
 public:
  PyKind kind() const { return kind_; }
  bool is(PyKind k) const { return kind_ == k; }
  bool is_none() const { return kind_ == PyKind::None; }
  bool is_tensor() const { return kind_ == PyKind::Tensor; }
  bool is_dict() const { return kind_ == PyKind::Dict; }
  bool is_sequence() const { return kind_ == PyKind::List || kind_ == PyKind::Tuple; }

  // Scalars; each throws naming what the value is when it is not that kind.
  bool as_bool() const;
  int64_t as_int() const;   // Int (and Bool, as Python does)
  double as_float() const;  // Float or Int
  const std::string& as_str() const;
  const std::string& as_bytes() const;
  const std::string& big_int() const;  // BigInt: its decimal digits

  // List, Tuple, Set: the items (Set: in pickle order).
  const std::vector<PyPtr>& items() const;
  size_t size() const;                        // items, or dict entries
  const PyValue& operator[](size_t i) const;  // throws when out of range

  // Dict: entries in insertion order, and lookups (nullptr when absent).
  const std::vector<std::pair<PyPtr, PyPtr>>& dict_items() const;
  const PyValue* get(std::string_view key) const;
  const PyValue* get(int64_t key) const;
  const PyValue& at(std::string_view key) const;  // throws listing a few keys that exist

  // Global: its dotted name. Object: the class or callable it came from.
  // Tuple/Dict/Set/Bytes: the Python type when it is not the plain one
  // ("torch.Size", "collections.OrderedDict", "frozenset", "bytearray"); else "".
  const std::string& type_name() const { return name_; }
  const PyValue* args() const;   // Object: the argument tuple
  const PyValue* state() const;  // Object / OrderedDict: what BUILD set, or nullptr
  // For objects whose state is a dict of attributes (argparse.Namespace, dataclasses):
  // the attribute, or nullptr.
  const PyValue* attr(std::string_view name) const;

  const TorchTensor& tensor() const;
  const std::shared_ptr<const TorchStorage>& storage() const;

  int depth() const { return depth_; }  // 1 for a leaf
  std::string describe() const;         // short, for errors: "dict of 12 entries", "tensor bfloat16[4, 7]"

  // ---- construction (the unpickler; tests) -------------------------------------------------
  static PyPtr none();
  static PyPtr boolean(bool b);
  static PyMut integer(int64_t v);
  static PyMut big_integer(std::string decimal);
  static PyMut floating(double v);
  static PyMut string(std::string s);
  static PyMut bytes(std::string b, std::string type_name = "");
  static PyMut list();
  static PyMut tuple(std::vector<PyPtr> items, std::string type_name = "");
  static PyMut set(std::string type_name = "");
  static PyMut dict(std::string type_name = "");
  static PyMut global(std::string name);
  static PyMut object(std::string name, PyPtr args);
  static PyMut storage_value(std::shared_ptr<const TorchStorage> s);
  static PyMut tensor_value(TorchTensor t);

  // Mutation while unpickling. A value placed inside another is frozen; changing
  // a frozen value, or placing a value in itself, is refused (that is how a
  // recursive pickle would build a cycle). max_depth bounds the nesting.
  // The error is a plain std::string thrown as PyValue::Refused.
  struct Refused {
    std::string what;
  };
  void append(const PyPtr& item, int max_depth);
  void set_item(const PyPtr& key, const PyPtr& value, int max_depth);  // replaces an equal key's value
  void add(const PyPtr& item, int max_depth);                          // Set
  void set_state(const PyPtr& state, int max_depth);                   // Object / OrderedDict (BUILD)
  bool frozen() const { return frozen_; }
  // Freezes `child` as a part of this value and raises this value's depth.
  void adopt(const PyPtr& child, int max_depth);

 private:
  PyValue() = default;
  static PyMut make(PyKind k);
  void check_mutable(const PyPtr& incoming) const;
  [[noreturn]] void wrong_kind(const char* wanted) const;

  PyKind kind_ = PyKind::None;
  bool bool_ = false;
  mutable bool frozen_ = false;  // set when placed in another value (never unset)
  int depth_ = 1;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;   // Str, Bytes, BigInt digits
  std::string name_;  // Global / Object name; type_name of containers
  std::vector<PyPtr> items_;
  std::vector<std::pair<PyPtr, PyPtr>> dict_;
  std::unordered_map<std::string, size_t> index_;  // dict: canonical key -> position in dict_
  PyPtr args_, state_;
  std::shared_ptr<const TorchStorage> storage_;
  std::shared_ptr<const TorchTensor> tensor_;
};

// The canonical form of a hashable key (Python's equality: 1 == 1.0 == True); false when
// the value is not hashable (list, dict, set, tensor-free bytearray ...).
bool py_key(const PyValue& v, std::string& out);

}  // namespace mpitron::io
