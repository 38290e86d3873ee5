// core/sha256.h — SHA-256 (FIPS 180-4) of bytes and files, as `sha256sum` prints it.
// For identities that a user can check by hand (the tokenizer files a checkpoint was
// trained with), not for speed: about 300 MB/s.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mpitron {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::string hex();  // finishes; lowercase hex of the 32-byte digest

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view bytes);
// Of a file's bytes; throws naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace mpitron
