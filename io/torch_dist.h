// io/torch_dist.h — torch.distributed.checkpoint directories (Megatron-Core's
// "torch_dist" format) mapped to files and byte ranges.
//
// A directory iter_XXXXXXX/ written by dist_checkpointing.save holds:
//   .metadata           a pickle (protocol 4) of torch.distributed.checkpoint.metadata.Metadata:
//                         state_dict_metadata: {fqn: TensorStorageMetadata(properties, size, chunks)
//                                                    | BytesStorageMetadata()}
//                         storage_data: {MetadataIndex(fqn, offset, index): _StorageInfo(relative_path,
//                                                                                 offset, length)}
//   __R_N.distcp        per writer rank R (and thread N) the items back to back, each a
//                       torch.save blob (a zip) at [offset, offset + length): a tensor
//                       chunk (its local shape = the chunk's sizes) or a pickled object
//   common.pt           torch.save of the non-sharded state (args, iteration, ...)
//   metadata.json       {"sharded_backend": "torch_dist", ...}
// A tensor's chunks tile its global shape; chunk c covers
// [offsets[d], offsets[d] + sizes[d]) of every dimension d.
//
// read_dcp_metadata() lists every key with its global shape, dtype and chunks
// (file, byte offset and length), checking that each chunk lies inside the
// global shape and names a storage item, that no two chunks of a key overlap,
// and that relative paths stay inside the directory. DcpCheckpoint reads any
// sub-rectangle of a key's GLOBAL tensor by opening only the chunks that
// overlap it and reading only the overlapping elements of each.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/torch_checkpoint.h"

namespace mpitron::io {

struct DcpChunk {
  std::vector<int64_t> offsets, sizes;  // in the global shape
  std::string file;                     // relative to the checkpoint directory ("__0_0.distcp")
  uint64_t offset = 0, length = 0;      // the torch.save blob's bytes in that file
};

struct DcpTensor {
  std::string fqn;
  TorchDType dtype = TorchDType::F32;
  std::vector<int64_t> size;  // global shape
  std::vector<DcpChunk> chunks;
};

struct DcpBytes {  // a pickled object (torch.save of a BytesIO): rng states, optimizer param groups, ...
  std::string fqn;
  std::string file;
  uint64_t offset = 0, length = 0;
};

struct DcpMetadata {
  PyPtr root;                      // the Metadata object, whole
  std::vector<DcpTensor> tensors;  // in .metadata order
  std::vector<DcpBytes> bytes;
  const DcpTensor* tensor(const std::string& fqn) const;  // nullptr when absent
  const DcpBytes* bytes_item(const std::string& fqn) const;
};

// Reads <dir>/.metadata over the allow-list.
DcpMetadata read_dcp_metadata(const std::string& dir, const PickleLimits& limits = {});

class DcpCheckpoint {
 public:
  explicit DcpCheckpoint(std::string dir, const PickleLimits& limits = {});
  const std::string& dir() const { return dir_; }
  const DcpMetadata& metadata() const { return md_; }

  // The torch.save blob of a chunk (its root is the chunk's tensor) or a bytes item.
  TorchFile open_chunk(const DcpChunk& c) const;
  TorchFile open_bytes(const DcpBytes& b) const;
  // [start, start + count) of the GLOBAL tensor `fqn`, row-major in dst, from the
  // chunks that overlap it (only their overlapping elements are read).
  void read_raw(const std::string& fqn, const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                void* dst) const;
  void read_f32(const std::string& fqn, const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                float* dst) const;
  // An open file of the checkpoint (kept open; counts its bytes read).
  std::shared_ptr<const ReadOnlyFile> file(const std::string& relative) const;
  // Bytes read so far from the checkpoint's files (the .metadata read at construction excluded).
  uint64_t bytes_read() const;

 private:
  std::string dir_;
  DcpMetadata md_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::shared_ptr<const ReadOnlyFile>> files_;
};

}  // namespace mpitron::io
