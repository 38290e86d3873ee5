// io/torch_checkpoint.h — one torch.save file (or blob), its value tree, and
// its tensors read lazily.
//
//   TorchFile f = TorchFile::open("iter_0000002/mp_rank_00/model_optim_rng.pt");
//   const PyValue& sd = f.root().at("model");                  // a dict
//   const TorchTensor& w = sd.at("decoder.layers.0.mlp.linear_fc1.weight").tensor();
//   std::vector<float> rows(8 * w.shape[1]);
//   f.read_f32(w, {16, 0}, {8, w.shape[1]}, rows.data());      // rows 16..23 only
//
// Opening reads the zip directory, the small records (byteorder, version) and
// data.pkl (CRC-checked), and unpickles it over the allow-list
// (io/torch_globals.h): each persistent id ('storage', <class>, key, location,
// numel) must name a record <archive>/data/<key> large enough for it, and every
// tensor view must lie inside its storage. No tensor byte is read until asked;
// a read of a sub-rectangle issues one pread per run of storage-contiguous
// elements it needs (adjacent runs merged) and nothing else.
//
// Refused by name, with what to do: the legacy (pre-1.6) torch.save format
// (a bare pickle beginning with torch's magic number, or the older tar
// archive), big-endian files, anything that is not a zip.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/torch_pickle.h"
#include "io/torch_value.h"
#include "io/torch_zip.h"

namespace mpitron::io {

struct TorchFileOptions {
  PickleLimits limits;
  uint64_t max_pickle_bytes = uint64_t{1} << 30;  // data.pkl larger than this is refused
};

class TorchFile {
 public:
  // A .pt/.pth/.bin written by torch.save (torch >= 1.6).
  static TorchFile open(const std::string& path, const TorchFileOptions& opt = {});
  // A torch.save blob at [offset, offset + length) of file (a torch_dist .distcp item).
  static TorchFile open_range(std::shared_ptr<const ReadOnlyFile> file, uint64_t offset, uint64_t length,
                              const TorchFileOptions& opt = {});

  const PyValue& root() const { return *root_; }
  const PyPtr& root_ptr() const { return root_; }
  const std::string& label() const;         // the path, or "path [offset +length]"
  const std::string& archive_name() const;  // the <archive> directory inside the zip
  const ZipArchive& zip() const;
  int64_t format_version() const;  // <archive>/.data/version or version; -1 if absent

  // All of tensor t in its stored dtype, row-major contiguous: t.nbytes() bytes.
  void read_raw(const TorchTensor& t, void* dst) const;
  std::vector<uint8_t> read_raw(const TorchTensor& t) const;
  // The sub-rectangle [start[d], start[d] + count[d]) of every dimension d,
  // row-major contiguous in dst (Π count · element size bytes).
  void read_raw(const TorchTensor& t, const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                void* dst) const;
  // The same converted to f32 (io/torch_dtype.h says how each type converts).
  void read_f32(const TorchTensor& t, float* dst) const;
  void read_f32(const TorchTensor& t, const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                float* dst) const;
  std::vector<float> to_f32(const TorchTensor& t) const;

  // Reads every storage record and checks its CRC-32; throws naming the first bad one.
  void verify() const;
  // Storages declared by the pickle (key -> storage), for tools.
  std::vector<std::shared_ptr<const TorchStorage>> storages() const;

 private:
  struct State;
  explicit TorchFile(std::shared_ptr<State> s);
  const ZipEntry& record_of(const TorchTensor& t) const;
  std::shared_ptr<State> s_;
  PyPtr root_;
};

// "legacy" when the bytes at the start of a file are the pre-1.6 torch.save
// format, "zip" for a zip archive, "" otherwise (reads at most 512 bytes).
std::string sniff_torch_format(const ReadOnlyFile& f, uint64_t offset, uint64_t length);

}  // namespace mpitron::io
