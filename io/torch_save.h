// io/torch_save.h — torch.save written without PyTorch: a protocol-2 pickle of a PyValue tree
// (io/torch_value.h) and the zip container around it, as torch.load (torch >= 1.6) reads them.
//
//   TorchSaveWriter w;
//   io::PyMut sd = io::PyValue::dict("collections.OrderedDict");
//   sd->set_item(io::PyValue::string("w"), w.tensor(io::TorchDType::F32, {2, 3}, bytes), 64);
//   w.save("model_optim_rng.pt", *root);   // archive "model_optim_rng" (the file's stem)
//
// The pickle is what CPython's pickler writes for the same objects at protocol 2 (torch.save's
// default), without the memo (BINPUT / BINGET are optional for a reader):
//   None / bool / int / float / str     NONE, NEWTRUE/NEWFALSE, BININT1/BININT2/BININT/LONG1,
//                                       BINFLOAT, BINUNICODE
//   bytes                               _codecs.encode(latin-1 text, 'latin1') REDUCE (protocol 2's way)
//   list / tuple / dict                 EMPTY_LIST + APPENDS, TUPLE1..3 / MARK TUPLE, EMPTY_DICT + SETITEMS
//   collections.OrderedDict             GLOBAL, EMPTY_TUPLE, REDUCE, SETITEMS (+ BUILD of its state)
//   Global ("torch.float32")            GLOBAL 'torch float32'
//   Object                              GLOBAL, args, NEWOBJ for argparse.Namespace (copyreg's
//                                       __newobj__), REDUCE otherwise; BUILD of its state
//   Tensor                              torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
//                                       requires_grad, OrderedDict()); the storage as the persistent
//                                       id ('storage', torch.<T>Storage, key, 'cpu', numel) BINPERSID
// Sets and integers beyond 64 bits are refused (no checkpoint written here holds one).
//
// The zip: STORED entries in torch's order (data.pkl, .format_version, .storage_alignment,
// byteorder, data/<key>..., version), each storage's data 64-byte aligned by padding in the local
// header's extra field (id 0x4246 "FB", as PyTorchStreamWriter pads), CRC-32 recorded, no
// timestamps and no random serialization id: the same tree gives the same bytes. ZIP64 is not
// written (files past 4 GiB are refused by name).
#pragma once
#include <cstdint>
#include <utility>
#include <string>
#include <vector>

#include "io/torch_value.h"

namespace mpitron::io {

// Protocol-2 pickle bytes of v. Storages are written as persistent ids; throws naming what has
// no protocol-2 form here.
std::string pickle_protocol2(const PyValue& v);

class TorchSaveWriter {
 public:
  // A contiguous tensor of `shape` over a storage of its own holding `bytes` (little-endian,
  // row-major, numel · element size bytes; checked). dtype must have a typed storage class.
  PyPtr tensor(TorchDType dtype, const std::vector<int64_t>& shape, std::vector<uint8_t> bytes);
  PyPtr tensor_f32(const std::vector<int64_t>& shape, const std::vector<float>& values);

  // Writes `root` and the storages made by tensor() to path (write-temp + rename), archive named
  // after path's stem as torch.save names it. Returns the bytes written.
  uint64_t save(const std::string& path, const PyValue& root) const;
  // The same bytes, in memory.
  std::string serialize(const PyValue& root, const std::string& archive) const;

 private:
  std::vector<std::pair<std::string, std::vector<uint8_t>>> data_;  // (storage key "0", "1", …, bytes) in order
  int64_t next_ = 0;
};

}  // namespace mpitron::io
