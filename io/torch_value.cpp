#include "io/torch_value.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace mpitron::io {

const char* py_kind_name(PyKind k) {
  switch (k) {
    case PyKind::None: return "None";
    case PyKind::Bool: return "bool";
    case PyKind::Int: return "int";
    case PyKind::BigInt: return "int (beyond 64 bits)";
    case PyKind::Float: return "float";
    case PyKind::Str: return "str";
    case PyKind::Bytes: return "bytes";
    case PyKind::List: return "list";
    case PyKind::Tuple: return "tuple";
    case PyKind::Set: return "set";
    case PyKind::Dict: return "dict";
    case PyKind::Global: return "global";
    case PyKind::Object: return "object";
    case PyKind::Storage: return "storage";
    case PyKind::Tensor: return "tensor";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// TorchTensor
// ---------------------------------------------------------------------------------------------
int64_t TorchTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // bounded when the tensor was built
  return n;
}

bool TorchTensor::contiguous() const {
  int64_t expect = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && stride[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

std::string TorchTensor::describe() const {
  std::string s = str(torch_dtype_name(dtype), "[");
  for (size_t i = 0; i < shape.size(); ++i) s += str(i ? ", " : "", shape[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------------------------
// PyValue: access
// ---------------------------------------------------------------------------------------------
void PyValue::wrong_kind(const char* wanted) const {
  MPT_THROW(str("expected ", wanted, ", found ", describe()), "the checkpoint does not have the layout expected here");
}

bool PyValue::as_bool() const {
  if (kind_ != PyKind::Bool) wrong_kind("a bool");
  return bool_;
}
int64_t PyValue::as_int() const {
  if (kind_ == PyKind::Bool) return bool_ ? 1 : 0;
  if (kind_ != PyKind::Int) wrong_kind("an int");
  return int_;
}
double PyValue::as_float() const {
  if (kind_ == PyKind::Float) return float_;
  if (kind_ == PyKind::Int) return static_cast<double>(int_);
  wrong_kind("a float");
}
const std::string& PyValue::as_str() const {
  if (kind_ != PyKind::Str) wrong_kind("a str");
  return str_;
}
const std::string& PyValue::as_bytes() const {
  if (kind_ != PyKind::Bytes) wrong_kind("bytes");
  return str_;
}
const std::string& PyValue::big_int() const {
  if (kind_ != PyKind::BigInt) wrong_kind("a big int");
  return str_;
}
const std::vector<PyPtr>& PyValue::items() const {
  if (kind_ != PyKind::List && kind_ != PyKind::Tuple && kind_ != PyKind::Set) wrong_kind("a list, tuple or set");
  return items_;
}
size_t PyValue::size() const { return kind_ == PyKind::Dict ? dict_.size() : items().size(); }
const PyValue& PyValue::operator[](size_t i) const {
  const auto& v = items();
  if (i >= v.size()) MPT_THROW(str("index ", i, " is past the end of a ", describe()), "");
  return *v[i];
}
const std::vector<std::pair<PyPtr, PyPtr>>& PyValue::dict_items() const {
  if (kind_ != PyKind::Dict) wrong_kind("a dict");
  return dict_;
}
const PyValue* PyValue::get(std::string_view key) const {
  if (kind_ != PyKind::Dict) wrong_kind("a dict");
  const auto it = index_.find(str("s:", key));
  return it == index_.end() ? nullptr : dict_[it->second].second.get();
}
const PyValue* PyValue::get(int64_t key) const {
  if (kind_ != PyKind::Dict) wrong_kind("a dict");
  const auto it = index_.find(str("i:", key));
  return it == index_.end() ? nullptr : dict_[it->second].second.get();
}
const PyValue& PyValue::at(std::string_view key) const {
  if (const PyValue* v = get(key)) return *v;
  std::string some;
  size_t shown = 0;
  for (const auto& [k, v] : dict_) {
    if (shown == 8) {
      some += ", ...";
      break;
    }
    some += shown++ ? ", " : "";
    some += k->kind_ == PyKind::Str ? "'" + k->str_ + "'" : k->describe();
  }
  MPT_THROW(str("no key '", key, "' in a ", describe(), " (keys: ", some, ")"),
            "the checkpoint does not have the layout expected here");
}
const PyValue* PyValue::args() const {
  if (kind_ != PyKind::Object) wrong_kind("an object");
  return args_.get();
}
const PyValue* PyValue::state() const { return state_.get(); }
const PyValue* PyValue::attr(std::string_view name) const {
  if (kind_ != PyKind::Object) wrong_kind("an object");
  if (!state_) return nullptr;
  if (state_->kind_ == PyKind::Dict) return state_->get(name);
  // (dict, slots) as Python's BUILD takes it
  if (state_->kind_ == PyKind::Tuple && state_->items_.size() == 2) {
    for (const PyPtr& part : state_->items_)
      if (part->kind_ == PyKind::Dict)
        if (const PyValue* v = part->get(name)) return v;
  }
  return nullptr;
}
const TorchTensor& PyValue::tensor() const {
  if (kind_ != PyKind::Tensor) wrong_kind("a tensor");
  return *tensor_;
}
const std::shared_ptr<const TorchStorage>& PyValue::storage() const {
  if (kind_ != PyKind::Storage) wrong_kind("a storage");
  return storage_;
}

std::string PyValue::describe() const {
  switch (kind_) {
    case PyKind::None: return "None";
    case PyKind::Bool: return bool_ ? "True" : "False";
    case PyKind::Int: return str("int ", int_);
    case PyKind::BigInt: return str("int ", str_.size() > 40 ? str_.substr(0, 40) + "..." : str_);
    case PyKind::Float: return str("float ", float_);
    case PyKind::Str: return str("str '", str_.size() > 40 ? str_.substr(0, 40) + "...'" : str_ + "'");
    case PyKind::Bytes: return str(name_.empty() ? "bytes" : name_, " of ", str_.size());
    case PyKind::List:
    case PyKind::Tuple:
    case PyKind::Set: return str(name_.empty() ? py_kind_name(kind_) : name_.c_str(), " of ", items_.size(), " items");
    case PyKind::Dict: return str(name_.empty() ? "dict" : name_.c_str(), " of ", dict_.size(), " entries");
    case PyKind::Global: return str("global ", name_);
    case PyKind::Object: return str("object ", name_);
    case PyKind::Storage: return str("storage ", storage_->type_name, " '", storage_->key, "'");
    case PyKind::Tensor: return str("tensor ", tensor_->describe());
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// PyValue: construction
// ---------------------------------------------------------------------------------------------
PyMut PyValue::make(PyKind k) {
  PyMut m(new PyValue());  // the constructor is private: values are made only here
  m->kind_ = k;
  return m;
}

PyPtr PyValue::none() {
  static const PyPtr v = [] {
    PyMut m = make(PyKind::None);
    m->frozen_ = true;
    return m;
  }();
  return v;
}
PyPtr PyValue::boolean(bool b) {
  static const PyPtr t = [] {
    PyMut m = make(PyKind::Bool);
    m->bool_ = true;
    m->frozen_ = true;
    return m;
  }();
  static const PyPtr f = [] {
    PyMut m = make(PyKind::Bool);
    m->frozen_ = true;
    return m;
  }();
  return b ? t : f;
}
PyMut PyValue::integer(int64_t v) {
  PyMut m = make(PyKind::Int);
  m->int_ = v;
  return m;
}
PyMut PyValue::big_integer(std::string decimal) {
  PyMut m = make(PyKind::BigInt);
  m->str_ = std::move(decimal);
  return m;
}
PyMut PyValue::floating(double v) {
  PyMut m = make(PyKind::Float);
  m->float_ = v;
  return m;
}
PyMut PyValue::string(std::string s) {
  PyMut m = make(PyKind::Str);
  m->str_ = std::move(s);
  return m;
}
PyMut PyValue::bytes(std::string b, std::string type_name) {
  PyMut m = make(PyKind::Bytes);
  m->str_ = std::move(b);
  m->name_ = std::move(type_name);
  return m;
}
PyMut PyValue::list() {
  PyMut m = make(PyKind::List);
  return m;
}
PyMut PyValue::tuple(std::vector<PyPtr> items, std::string type_name) {
  PyMut m = make(PyKind::Tuple);
  m->name_ = std::move(type_name);
  for (const PyPtr& it : items)
    if (it.get() == m.get()) throw Refused{"a tuple contains itself"};
  int depth = 1;
  for (const PyPtr& it : items) {
    it->frozen_ = true;
    depth = std::max(depth, it->depth_ + 1);
  }
  m->depth_ = depth;
  m->items_ = std::move(items);
  return m;
}
PyMut PyValue::set(std::string type_name) {
  PyMut m = make(PyKind::Set);
  m->name_ = std::move(type_name);
  return m;
}
PyMut PyValue::dict(std::string type_name) {
  PyMut m = make(PyKind::Dict);
  m->name_ = std::move(type_name);
  return m;
}
PyMut PyValue::global(std::string name) {
  PyMut m = make(PyKind::Global);
  m->name_ = std::move(name);
  return m;
}
PyMut PyValue::object(std::string name, PyPtr args) {
  PyMut m = make(PyKind::Object);
  m->name_ = std::move(name);
  if (args) {
    args->frozen_ = true;
    m->depth_ = args->depth_ + 1;
  }
  m->args_ = std::move(args);
  return m;
}
PyMut PyValue::storage_value(std::shared_ptr<const TorchStorage> s) {
  PyMut m = make(PyKind::Storage);
  m->storage_ = std::move(s);
  return m;
}
PyMut PyValue::tensor_value(TorchTensor t) {
  PyMut m = make(PyKind::Tensor);
  if (t.attrs) {
    t.attrs->frozen_ = true;
    m->depth_ = t.attrs->depth_ + 1;
  }
  m->tensor_ = std::make_shared<const TorchTensor>(std::move(t));
  return m;
}

// ---------------------------------------------------------------------------------------------
// PyValue: mutation while unpickling
// ---------------------------------------------------------------------------------------------
void PyValue::check_mutable(const PyPtr& incoming) const {
  if (frozen_)
    throw Refused{str("a ", describe(),
                      " is changed after it was placed inside another value (a recursive or self-referencing pickle)")};
  if (incoming.get() == this) throw Refused{str("a ", describe(), " is placed inside itself (a recursive pickle)")};
}

void PyValue::adopt(const PyPtr& child, int max_depth) {
  if (!child) return;
  if (child.get() == this) throw Refused{str("a ", describe(), " is placed inside itself (a recursive pickle)")};
  child->frozen_ = true;
  if (child->depth_ + 1 > max_depth) throw Refused{str("values are nested deeper than ", max_depth, " levels")};
  depth_ = std::max(depth_, child->depth_ + 1);
}

void PyValue::append(const PyPtr& item, int max_depth) {
  if (kind_ != PyKind::List) throw Refused{str("APPEND to a ", describe(), ", not a list")};
  check_mutable(item);
  adopt(item, max_depth);
  items_.push_back(item);
}

void PyValue::add(const PyPtr& item, int max_depth) {
  if (kind_ != PyKind::Set) throw Refused{str("ADDITEMS to a ", describe(), ", not a set")};
  check_mutable(item);
  std::string k;
  if (!py_key(*item, k)) throw Refused{str("a set item is unhashable (", item->describe(), ")")};
  adopt(item, max_depth);
  if (index_.emplace(k, items_.size()).second) items_.push_back(item);
}

void PyValue::set_item(const PyPtr& key, const PyPtr& value, int max_depth) {
  if (kind_ != PyKind::Dict) throw Refused{str("SETITEM on a ", describe(), ", not a dict")};
  check_mutable(key);
  check_mutable(value);
  std::string k;
  if (!py_key(*key, k)) throw Refused{str("a dict key is unhashable (", key->describe(), ")")};
  adopt(key, max_depth);
  adopt(value, max_depth);
  const auto [it, fresh] = index_.emplace(std::move(k), dict_.size());
  if (fresh)
    dict_.emplace_back(key, value);
  else
    dict_[it->second].second = value;  // Python keeps the first key object and the last value
}

void PyValue::set_state(const PyPtr& state, int max_depth) {
  if (kind_ != PyKind::Object && !(kind_ == PyKind::Dict && !name_.empty()))
    throw Refused{str("BUILD on a ", describe(), " (only objects and OrderedDicts take a state)")};
  check_mutable(state);
  if (state_) throw Refused{str("BUILD twice on a ", describe())};
  adopt(state, max_depth);
  state_ = state;
}

// ---------------------------------------------------------------------------------------------
// Hashable keys
// ---------------------------------------------------------------------------------------------
bool py_key(const PyValue& v, std::string& out) {
  switch (v.kind()) {
    case PyKind::None: out = "n"; return true;
    case PyKind::Bool:
    case PyKind::Int: out = str("i:", v.as_int()); return true;
    case PyKind::BigInt: out = "I:" + v.big_int(); return true;
    case PyKind::Float: {
      const double f = v.as_float();
      if (std::isfinite(f) && f == std::floor(f) && std::fabs(f) < 9.2e18) {
        out = str("i:", static_cast<int64_t>(f));
      } else {
        uint64_t bits;
        std::memcpy(&bits, &f, 8);
        out = str("f:", bits);
      }
      return true;
    }
    case PyKind::Str: out = "s:" + v.as_str(); return true;
    case PyKind::Bytes:
      if (v.type_name() == "bytearray") return false;
      out = "b:" + v.as_bytes();
      return true;
    case PyKind::Tuple: {
      std::string s = "t(";
      for (const PyPtr& it : v.items()) {
        std::string k;
        if (!py_key(*it, k)) return false;
        s += str(k.size(), ":", k, ",");
      }
      out = s + ")";
      return true;
    }
    case PyKind::Global: out = "g:" + v.type_name(); return true;
    case PyKind::Set:
      if (v.type_name() != "frozenset") return false;
      [[fallthrough]];
    case PyKind::Object:
    case PyKind::Storage:
    case PyKind::Tensor:  // hashed by identity, as Python does for objects without __eq__
      out = str("o:", static_cast<const void*>(&v));
      return true;
    case PyKind::List:
    case PyKind::Dict: return false;
  }
  return false;
}

}  // namespace mpitron::io
