// io/torch_pickle.h — a pickle reader that builds a PyValue tree and executes nothing.
//
// Reads protocols 0 through 5 as CPython's _pickle does, minus what no
// checkpoint needs (protocol 0/1 text strings and class instantiation, the
// copyreg extension registry, out-of-band buffers): those opcodes are refused
// by name. torch.save writes protocol 2 (its default); torch.distributed.
// checkpoint's .metadata is pickle.dump's default (4 on Python 3.8-3.13).
//
// Globals (GLOBAL, STACK_GLOBAL) must be on the allow-list of
// io/torch_globals.h; anything else ("os.system", "builtins.eval") is refused
// with an error naming it, before anything could use it. REDUCE, NEWOBJ and
// BUILD on allowed globals build values (tensors, OrderedDicts, opaque
// objects): nothing is ever called.
//
// Hostile input gives an Error naming `where` (the file and entry), the byte
// offset and opcode, and what is wrong, never a crash, hang or huge allocation:
//   - a declared length (strings, bytes, frames, big ints) is checked against
//     the bytes that remain before anything is allocated;
//   - the value stack and the MARK stack underflow cleanly;
//   - memo gets of absent keys are refused;
//   - nesting deeper than max_depth, cycles (a value changed after it was
//     placed in another, or placed in itself) and unhashable dict keys are
//     refused (see io/torch_value.h);
//   - the number of values is bounded (max_values);
//   - the pickle must end with STOP leaving exactly one value.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "io/torch_value.h"

namespace mpitron::io {

struct PickleLimits {
  int max_depth = 200;                      // nesting of containers (CPython's own limit is ~1000 frames)
  uint64_t max_values = uint64_t{1} << 24;  // values created (~100 bytes each)
  uint64_t max_big_int_bytes = 1024;        // LONG1/LONG4 beyond 64 bits
};

// Thrown by a PersistentLoad (and the globals' builders) with what is wrong; the
// unpickler turns it into an Error naming where and at which byte.
struct PickleFault {
  std::string what, hint;
};

// Given the persistent id of BINPERSID (torch: a tuple ('storage', storage class,
// key, location, numel)), returns the value that stands for it (a Storage), or
// throws PickleFault.
using PersistentLoad = std::function<PyPtr(const PyValue& pid)>;

PyPtr unpickle(const uint8_t* data, size_t n, const std::string& where, const PersistentLoad& persistent_load = {},
               const PickleLimits& limits = {});

}  // namespace mpitron::io
