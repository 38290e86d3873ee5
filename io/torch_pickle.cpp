#include "io/torch_pickle.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "io/torch_globals.h"

namespace mpitron::io {

namespace {

const char* opcode_name(uint8_t op) {
  switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
  }
  return nullptr;
}

// Little-endian two's complement -> decimal digits (with '-').
std::string twos_complement_decimal(const uint8_t* p, size_t n) {
  const bool neg = n > 0 && (p[n - 1] & 0x80);
  std::vector<uint8_t> mag(p, p + n);
  if (neg) {  // magnitude = ~x + 1
    unsigned carry = 1;
    for (uint8_t& b : mag) {
      const unsigned v = static_cast<uint8_t>(~b) + carry;
      b = static_cast<uint8_t>(v);
      carry = v >> 8;
    }
  }
  // base-256 (little-endian) -> base 10^9 by repeated division
  std::vector<uint32_t> chunks;
  while (!mag.empty() && mag.back() == 0) mag.pop_back();
  while (!mag.empty()) {
    uint64_t rem = 0;
    for (size_t i = mag.size(); i-- > 0;) {
      const uint64_t cur = (rem << 8) | mag[i];
      mag[i] = static_cast<uint8_t>(cur / 1000000000u);
      rem = cur % 1000000000u;
    }
    chunks.push_back(static_cast<uint32_t>(rem));
    while (!mag.empty() && mag.back() == 0) mag.pop_back();
  }
  if (chunks.empty()) return "0";
  std::string s = neg ? "-" : "";
  s += std::to_string(chunks.back());
  for (size_t i = chunks.size() - 1; i-- > 0;) {
    const std::string d = std::to_string(chunks[i]);
    s += std::string(9 - d.size(), '0') + d;
  }
  return s;
}

class Machine {
 public:
  Machine(const uint8_t* data, size_t n, const std::string& where, const PersistentLoad& pl, const PickleLimits& lim)
      : p_(data), n_(n), where_(where), pl_(pl), lim_(lim) {}

  PyPtr run() {
    try {
      return loop();
    } catch (const PickleFault& f) {
      fail(f.what, f.hint);
    } catch (const PyValue::Refused& r) {
      fail(r.what, "");
    } catch (const std::bad_alloc&) {
      fail("out of memory while unpickling", "the pickle is damaged or larger than this machine can hold");
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& hint) {
    const char* name = opcode_name(op_);
    MPT_THROW(str(where_, ": pickle byte ", op_at_, " (", name ? name : "opcode", "): ", what),
              hint.empty() ? "the file is damaged, or is not a checkpoint written by torch.save" : hint);
  }

  // ---- input ------------------------------------------------------------------------------------
  const uint8_t* take(uint64_t k) {
    if (k > n_ - pos_)
      throw PickleFault{str("needs ", k, " bytes but only ", n_ - pos_,
                            " remain (a length past the data: truncated "
                            "or damaged)"),
                        ""};
    const uint8_t* q = p_ + pos_;
    pos_ += static_cast<size_t>(k);
    return q;
  }
  uint64_t le(int bytes) {
    const uint8_t* q = take(static_cast<uint64_t>(bytes));
    uint64_t v = 0;
    for (int i = bytes; i-- > 0;) v = (v << 8) | q[i];
    return v;
  }
  std::string line() {  // up to '\n' (protocol 0 arguments, GLOBAL names)
    const void* nl = std::memchr(p_ + pos_, '\n', n_ - pos_);
    if (!nl) throw PickleFault{"an argument line has no end (truncated)", ""};
    const size_t len = static_cast<size_t>(static_cast<const uint8_t*>(nl) - (p_ + pos_));
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len + 1;
    return s;
  }
  int64_t decimal(const std::string& s, const char* what) {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || errno != 0 || (*end != '\0' && !(*end == 'L' && end[1] == '\0')))
      throw PickleFault{str(what, " '", s.substr(0, 40), "' is not a 64-bit decimal integer"), ""};
    return v;
  }

  // ---- stack ------------------------------------------------------------------------------------
  void push(PyPtr v) {
    if (v->depth() > lim_.max_depth)
      throw PickleFault{str("values are nested deeper than ", lim_.max_depth, " levels"), ""};
    stack_.push_back(std::move(v));
  }
  void push_new(PyPtr v) {
    if (++values_ > lim_.max_values)
      throw PickleFault{str("more than ", lim_.max_values, " values"),
                        "the pickle is damaged, or larger than PickleLimits::max_values allows"};
    push(std::move(v));
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  PyPtr pop() {
    if (stack_.size() <= floor()) throw PickleFault{"the stack is empty (stack underflow)", ""};
    PyPtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  const PyPtr& top() const {
    if (stack_.size() <= floor()) throw PickleFault{"the stack is empty (stack underflow)", ""};
    return stack_.back();
  }
  std::vector<PyPtr> pop_mark() {  // the items above the last MARK, and the MARK
    if (marks_.empty()) throw PickleFault{"no MARK on the stack", ""};
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PyPtr> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(m)),
                             std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return items;
  }
  PyMut mut(const PyPtr& v) const { return std::const_pointer_cast<PyValue>(v); }  // our own values only

  // ---- memo -------------------------------------------------------------------------------------
  void memo_put(uint64_t key) { memo_[key] = top(); }
  void memo_get(uint64_t key) {
    const auto it = memo_.find(key);
    if (it == memo_.end()) throw PickleFault{str("memo key ", key, " was never stored"), ""};
    push(it->second);
  }

  // ---- the loop ---------------------------------------------------------------------------------
  PyPtr loop() {
    const int D = lim_.max_depth;
    while (true) {
      if (pos_ >= n_) {
        op_ = 0;
        op_at_ = pos_;
        throw PickleFault{"the data ends without STOP (truncated)", ""};
      }
      op_at_ = pos_;
      op_ = p_[pos_++];
      switch (op_) {
        case 0x80: {  // PROTO
          const uint8_t v = *take(1);
          if (v > 5)
            throw PickleFault{str("pickle protocol ", int{v}, " is newer than 5"), "re-save with protocol <= 5"};
          break;
        }
        case 0x95: {  // FRAME: a length hint, checked and otherwise ignored
          const uint64_t k = le(8);
          if (k > n_ - pos_) throw PickleFault{str("a frame of ", k, " bytes, but only ", n_ - pos_, " remain"), ""};
          break;
        }
        case '.': {  // STOP
          PyPtr v = pop();
          if (!stack_.empty() || !marks_.empty())
            throw PickleFault{str("STOP leaves ", stack_.size(), " more values and ", marks_.size(), " marks"), ""};
          return v;
        }
        case '(': marks_.push_back(stack_.size()); break;
        case '0': pop(); break;
        case '1': pop_mark(); break;
        case '2': push(top()); break;

        case 'N': push(PyValue::none()); break;
        case 0x88: push(PyValue::boolean(true)); break;
        case 0x89: push(PyValue::boolean(false)); break;
        case 'J': push_new(PyValue::integer(static_cast<int32_t>(le(4)))); break;
        case 'K': push_new(PyValue::integer(static_cast<int64_t>(le(1)))); break;
        case 'M': push_new(PyValue::integer(static_cast<int64_t>(le(2)))); break;
        case 0x8a:
        case 0x8b: {  // LONG1, LONG4: little-endian two's complement of the given length
          const uint64_t k = op_ == 0x8a ? le(1) : static_cast<uint64_t>(static_cast<int32_t>(le(4)));
          if (op_ == 0x8b && static_cast<int64_t>(k) < 0) throw PickleFault{"LONG4 with a negative length", ""};
          if (k > n_ - pos_) throw PickleFault{str("an integer of ", k, " bytes, but only ", n_ - pos_, " remain"), ""};
          if (k > lim_.max_big_int_bytes)
            throw PickleFault{str("an integer of ", k, " bytes (more than ", lim_.max_big_int_bytes, ")"), ""};
          const uint8_t* q = take(k);
          if (k <= 8) {
            uint64_t v = 0;
            for (uint64_t i = k; i-- > 0;) v = (v << 8) | q[i];
            if (k > 0 && k < 8 && (q[k - 1] & 0x80)) v |= ~uint64_t{0} << (8 * k);  // sign-extend
            push_new(PyValue::integer(static_cast<int64_t>(v)));
          } else {
            push_new(PyValue::big_integer(twos_complement_decimal(q, static_cast<size_t>(k))));
          }
          break;
        }
        case 'I': {  // INT (protocol 0): "01"/"00" are True/False
          const std::string s = line();
          if (s == "01" || s == "00")
            push(PyValue::boolean(s == "01"));
          else
            push_new(PyValue::integer(decimal(s, "INT")));
          break;
        }
        case 'L': push_new(PyValue::integer(decimal(line(), "LONG"))); break;
        case 'F': {
          const std::string s = line();
          char* end = nullptr;
          const double v = std::strtod(s.c_str(), &end);
          if (s.empty() || *end != '\0') throw PickleFault{str("FLOAT '", s.substr(0, 40), "' is not a number"), ""};
          push_new(PyValue::floating(v));
          break;
        }
        case 'G': {  // BINFLOAT: big-endian IEEE double
          const uint8_t* q = take(8);
          uint64_t bits = 0;
          for (int i = 0; i < 8; ++i) bits = (bits << 8) | q[i];
          double v;
          std::memcpy(&v, &bits, 8);
          push_new(PyValue::floating(v));
          break;
        }

        case 'X': push_new(PyValue::string(chars(le(4)))); break;
        case 0x8c: push_new(PyValue::string(chars(le(1)))); break;
        case 0x8d: push_new(PyValue::string(chars(le(8)))); break;
        case 'T': {  // BINSTRING (a Python 2 str): decoded as torch.load does (UTF-8)
          const int64_t k = static_cast<int32_t>(le(4));
          if (k < 0) throw PickleFault{"BINSTRING with a negative length", ""};
          push_new(PyValue::string(chars(static_cast<uint64_t>(k))));
          break;
        }
        case 'U': push_new(PyValue::string(chars(le(1)))); break;
        case 'B': push_new(PyValue::bytes(chars(le(4)))); break;
        case 'C': push_new(PyValue::bytes(chars(le(1)))); break;
        case 0x8e: push_new(PyValue::bytes(chars(le(8)))); break;
        case 0x96: push_new(PyValue::bytes(chars(le(8)), "bytearray")); break;

        case ')': push_new(PyValue::tuple({})); break;
        case 0x85:
        case 0x86:
        case 0x87: {
          const int k = op_ - 0x84;
          std::vector<PyPtr> items(static_cast<size_t>(k));
          for (int i = k; i-- > 0;) items[static_cast<size_t>(i)] = pop();
          push_new(PyValue::tuple(std::move(items)));
          break;
        }
        case 't': push_new(PyValue::tuple(pop_mark())); break;
        case ']': push_new(PyValue::list()); break;
        case 'l': {
          std::vector<PyPtr> items = pop_mark();
          PyMut l = PyValue::list();
          for (const PyPtr& it : items) l->append(it, D);
          push_new(l);
          break;
        }
        case 'a': {
          PyPtr item = pop();
          mut(top())->append(item, D);
          break;
        }
        case 'e': {
          std::vector<PyPtr> items = pop_mark();
          const PyMut l = mut(top());
          for (const PyPtr& it : items) l->append(it, D);
          break;
        }
        case '}': push_new(PyValue::dict()); break;
        case 'd': {
          std::vector<PyPtr> items = pop_mark();
          if (items.size() % 2) throw PickleFault{"DICT with an odd number of items", ""};
          PyMut d = PyValue::dict();
          for (size_t i = 0; i < items.size(); i += 2) d->set_item(items[i], items[i + 1], D);
          push_new(d);
          break;
        }
        case 's': {
          PyPtr v = pop(), k = pop();
          mut(top())->set_item(k, v, D);
          break;
        }
        case 'u': {
          std::vector<PyPtr> items = pop_mark();
          if (items.size() % 2) throw PickleFault{"SETITEMS with an odd number of items", ""};
          const PyMut d = mut(top());
          for (size_t i = 0; i < items.size(); i += 2) d->set_item(items[i], items[i + 1], D);
          break;
        }
        case 0x8f: push_new(PyValue::set()); break;
        case 0x90: {
          std::vector<PyPtr> items = pop_mark();
          const PyMut s = mut(top());
          for (const PyPtr& it : items) s->add(it, D);
          break;
        }
        case 0x91: {
          std::vector<PyPtr> items = pop_mark();
          PyMut s = PyValue::set("frozenset");
          for (const PyPtr& it : items) s->add(it, D);
          push_new(s);
          break;
        }

        case 'p': memo_put(static_cast<uint64_t>(decimal(line(), "PUT"))); break;
        case 'q': memo_put(le(1)); break;
        case 'r': memo_put(le(4)); break;
        case 0x94: memo_put(memo_.size()); break;
        case 'g': memo_get(static_cast<uint64_t>(decimal(line(), "GET"))); break;
        case 'h': memo_get(le(1)); break;
        case 'j': memo_get(le(4)); break;

        case 'c': {
          const std::string module = line();
          const std::string name = line();
          push_new(PyValue::global(torch_global_checked(module, name)));
          break;
        }
        case 0x93: {
          PyPtr name = pop(), module = pop();
          if (!name->is(PyKind::Str) || !module->is(PyKind::Str))
            throw PickleFault{
                str("STACK_GLOBAL needs two strings, found ", module->describe(), " and ", name->describe()), ""};
          push_new(PyValue::global(torch_global_checked(module->as_str(), name->as_str())));
          break;
        }
        case 'R': {
          PyPtr args = pop(), fn = pop();
          if (!args->is(PyKind::Tuple))
            throw PickleFault{str("REDUCE arguments are a ", args->describe(), ", not a tuple"), ""};
          if (!fn->is(PyKind::Global)) throw PickleFault{str("REDUCE calls a ", fn->describe(), ", not a global"), ""};
          push_new(torch_global_reduce(*fn, args, D));
          break;
        }
        case 0x81: {
          PyPtr args = pop(), cls = pop();
          if (!args->is(PyKind::Tuple))
            throw PickleFault{str("NEWOBJ arguments are a ", args->describe(), ", not a tuple"), ""};
          if (!cls->is(PyKind::Global)) throw PickleFault{str("NEWOBJ on a ", cls->describe(), ", not a class"), ""};
          push_new(torch_global_newobj(*cls, args, D));
          break;
        }
        case 0x92: {
          PyPtr kwargs = pop(), args = pop(), cls = pop();
          if (!kwargs->is(PyKind::Dict) || kwargs->size() != 0)
            throw PickleFault{"NEWOBJ_EX with keyword arguments is not supported", ""};
          if (!args->is(PyKind::Tuple) || !cls->is(PyKind::Global))
            throw PickleFault{str("NEWOBJ_EX on a ", cls->describe(), " with ", args->describe()), ""};
          push_new(torch_global_newobj(*cls, args, D));
          break;
        }
        case 'b': {
          PyPtr state = pop();
          torch_global_build(*mut(top()), state, D);
          if (top()->depth() > D) throw PickleFault{str("values are nested deeper than ", D, " levels"), ""};
          break;
        }
        case 'Q': {
          PyPtr pid = pop();
          if (!pl_) throw PickleFault{"a persistent id (a storage) in a pickle that may not hold any", ""};
          push_new(pl_(*pid));
          break;
        }

        case 'P': throw PickleFault{"protocol 0 text persistent ids are not supported", "re-save with torch.save"};
        case 'S':
        case 'V':
          throw PickleFault{"protocol 0 text strings are not supported", "re-save with torch.save (protocol 2)"};
        case 'i':
        case 'o':
          throw PickleFault{"protocol 0/1 class instantiation is not supported",
                            "re-save with torch.save (protocol 2)"};
        case 0x82:
        case 0x83:
        case 0x84: throw PickleFault{"copyreg extension codes are not supported", ""};
        case 0x97:
        case 0x98: throw PickleFault{"out-of-band buffers (protocol 5 NEXT_BUFFER) are not supported", ""};
        default: throw PickleFault{str("unknown opcode 0x", hex(op_)), ""};
      }
    }
  }

  std::string chars(uint64_t k) {
    const uint8_t* q = take(k);  // checked against what remains before the string is made
    return std::string(reinterpret_cast<const char*>(q), static_cast<size_t>(k));
  }
  static std::string hex(uint8_t b) {
    const char* d = "0123456789abcdef";
    return {d[b >> 4], d[b & 15]};
  }

  const uint8_t* p_;
  size_t n_, pos_ = 0, op_at_ = 0;
  uint8_t op_ = 0;
  const std::string& where_;
  const PersistentLoad& pl_;
  const PickleLimits& lim_;
  std::vector<PyPtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PyPtr> memo_;
  uint64_t values_ = 0;
};

}  // namespace

PyPtr unpickle(const uint8_t* data, size_t n, const std::string& where, const PersistentLoad& persistent_load,
               const PickleLimits& limits) {
  return Machine(data, n, where, persistent_load, limits).run();
}

}  // namespace mpitron::io
