// io/checkpoint_manifest.h — the checkpoint file verified before HDF5 reads it.
//
// libhdf5 trusts its own metadata: one flipped byte in an object header can
// make H5Fopen / H5Lvisit crash the process (h5dump crashes on such a file
// too). So the checkpoint writer records, after the HDF5 file is closed, a
// manifest beside it (iter_N/manifest.json, docs/checkpoint-format.md):
//
//   {"format":"mpitron-ckpt-manifest","version":1,"file":"model_optim_rng.h5",
//    "bytes":N,"checksum":"crc32c","data":[[off,len],...],"meta":[[off,len,crc],...]}
//   crc32c 0x1234abcd                      <- CRC-32C of the first line
//
// `data` are the byte ranges of the datasets' values (each proved by its own
// per-dataset CRC when it is read, read_verified); `meta` are all the other
// bytes of the file (superblock, object headers, heaps, B-trees, attributes,
// free space) in ranges of at most 1 MiB with their CRC-32C. Together they
// tile [0, bytes) exactly. Before the file is handed to HDF5, the reader checks
// its size and every `meta` range (a few KiB to MiB, read with pread), so
// HDF5 only ever parses metadata bytes that are exactly the ones written.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mpitron::io {

constexpr const char* kManifestFileName = "manifest.json";

// Writes <dir of h5_path>/manifest.json for the closed file h5_path, whose
// dataset values lie in `data_ranges` (file offset, length; any order, may be
// empty), and fsyncs it. Throws an Error naming the file on I/O failure.
// `run`, when not empty, is recorded as "run": the training run (lineage) that wrote it.
void write_checkpoint_manifest(const std::string& h5_path, std::vector<std::pair<uint64_t, uint64_t>> data_ranges,
                               const std::string& run = "");

// The "run" of the manifest in iter_dir ("" when it has none, or no readable manifest).
std::string checkpoint_run(const std::string& iter_dir);

// Checks h5_path against the manifest beside it before anything parses it:
// the size (a short file is "truncated"), and the CRC of every metadata
// range. Throws CheckpointDamaged naming the file and what differs. Returns
// false (and checks nothing) when there is no manifest: a checkpoint written
// before manifests existed.
bool verify_checkpoint_manifest(const std::string& h5_path);

}  // namespace mpitron::io
