// data/tokenizer.h — GPT-2 byte-level BPE (Megatron's GPT2BPETokenizer).
//
// Same ids as OpenAI's encoder.py, Hugging Face `tokenizers` (ByteLevel + BPE)
// and Megatron on the same gpt2-vocab.json / gpt2-merges.txt:
//   1. pre-tokenise with the GPT-2 regex (PCRE2, UTF + UCP, JIT-compiled);
//   2. each piece is BPE-merged on its UTF-8 bytes (a byte's initial symbol is
//      the vocab entry of its byte-to-unicode character), always merging the
//      adjacent pair of lowest merge rank (= line number in the merges file).
// A literal "<|endoftext|>" in text is ordinary text (as in Megatron); only
// `eod()` (50256) is the end-of-document token.
//
// Threading: `Tokenizer` is immutable after construction and may be shared;
// an `Encoder` holds per-thread scratch (regex match data, word cache), so use
// one Encoder per thread. `Tokenizer::encode` is a convenience that builds a
// temporary Encoder (no cache reuse across calls: use an Encoder in loops).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mpitron::data {

class Encoder;

class Tokenizer {
 public:
  // Loads vocab (JSON object token → id) and merges ("#version" line skipped).
  Tokenizer(const std::string& vocab_file, const std::string& merges_file);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Default asset paths (assets/gpt2 in the source tree this was built from).
  static std::string default_vocab_file();
  static std::string default_merges_file();

  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string decode(const int32_t* ids, size_t n) const;
  std::string_view token_bytes(int32_t id) const;  // raw bytes of one token

  int64_t vocab_size() const { return static_cast<int64_t>(id_to_bytes_.size()); }
  int32_t eod() const { return eod_; }  // "<|endoftext|>" (50256 for GPT-2)

  std::unique_ptr<Encoder> make_encoder() const;

 private:
  friend class Encoder;
  struct MergeTable;  // (left id, right id) → (rank, merged id), open addressing

  // BPE-merge one pre-tokenised piece; appends ids to out.
  void bpe(std::string_view piece, std::vector<int32_t>& scratch, std::vector<int32_t>& out) const;
  void bpe_long(std::string_view piece, std::vector<int32_t>& out) const;  // O(n log n) for long pieces

  std::vector<std::string> id_to_bytes_;  // [vocab] token id → its bytes
  int32_t byte_id_[256];                  // byte → id of its single-byte token
  std::unique_ptr<MergeTable> merges_;
  int32_t eod_ = -1;
  void* regex_ = nullptr;  // pcre2_code_8*, JIT-compiled (shared read-only)
  std::string vocab_file_;
};

// Per-thread encoding state: regex match data and a cache piece → ids.
class Encoder {
 public:
  explicit Encoder(const Tokenizer& tok);
  ~Encoder();
  Encoder(const Encoder&) = delete;
  Encoder& operator=(const Encoder&) = delete;

  // Appends the ids of `text` to `out`. Throws mpitron::Error naming the byte
  // offset when text is not valid UTF-8.
  void encode(std::string_view text, std::vector<int32_t>& out);
  std::vector<int32_t> encode(std::string_view text) {
    std::vector<int32_t> out;
    encode(text, out);
    return out;
  }

 private:
  struct Cache;
  const Tokenizer& tok_;
  void* match_data_ = nullptr;     // pcre2_match_data_8*
  void* match_context_ = nullptr;  // pcre2_match_context_8* (owns the JIT stack binding)
  void* jit_stack_ = nullptr;      // pcre2_jit_stack_8*
  std::unique_ptr<Cache> cache_;
  std::vector<int32_t> scratch_;
};

// Vocab size rounded up to a multiple of divisible_by × tp (Megatron's
// --make-vocab-size-divisible-by): 50257 → 50304 at tp=1, 51200 at tp=8.
int64_t padded_vocab_size(int64_t vocab_size, int tensor_parallel_size = 1, int divisible_by = 128);

// Returns the byte offset of the first invalid UTF-8 sequence, or -1 when
// `s` is valid (overlongs, surrogates and code points > U+10FFFF are invalid).
int64_t find_invalid_utf8(std::string_view s);

}  // namespace mpitron::data
