// io/safetensors.h — read and write Hugging Face safetensors files.
//
// File layout (https://github.com/huggingface/safetensors, format "v0"):
//   u64 LE   N = length of the header
//   N bytes  UTF-8 JSON object: "name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}
//            for every tensor, plus an optional "__metadata__": {string: string};
//            offsets are relative to the byte after the header, end exclusive.
//   data     the tensors' raw little-endian row-major bytes
// The reader checks everything a corrupt file could get wrong (header length,
// JSON, dtype names, numel·size == end − begin, offsets inside the file, no
// overlaps) and throws naming the file and tensor.
// The writer lays the tensors out in the order given, pads the header with
// spaces to a multiple of 8 bytes (as the reference implementation does) and
// writes header keys sorted by name, so equal inputs give identical files.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace mpitron::io {

struct SafeTensor {
  std::string name;
  std::string dtype;           // "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", ...
  Shape shape;                 // {} for a scalar
  std::vector<uint8_t> bytes;  // raw little-endian data, numel · dtype size bytes
  int64_t numel() const { return shape_numel(shape); }
};

// Bytes per element of a safetensors dtype name; throws for unknown names.
size_t safetensors_dtype_size(const std::string& dtype);

struct Safetensors {
  std::vector<SafeTensor> tensors;              // in file (data offset) order
  std::map<std::string, std::string> metadata;  // "__metadata__"

  bool has(const std::string& name) const { return index(name) >= 0; }
  const SafeTensor& at(const std::string& name) const;  // throws naming the file content when missing
  int64_t index(const std::string& name) const;         // -1 when missing
  // The tensor as a host f32 Tensor (F32 copied, F16/BF16 widened exactly, F64 rounded).
  Tensor to_f32(const std::string& name) const;
  // Appends a tensor from a host f32 tensor, stored as dtype "F32", "F16" or "BF16"
  // (round to nearest even for the half types).
  void add_f32(const std::string& name, const Tensor& t, const std::string& dtype = "F32");
};

Safetensors read_safetensors(const std::string& path);
void write_safetensors(const std::string& path, const Safetensors& st);

}  // namespace mpitron::io
