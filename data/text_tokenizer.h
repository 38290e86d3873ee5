// data/text_tokenizer.h — the tokenizer interface the apps use, and its factory.
//
// Three implementations, chosen by Megatron's flags:
//   GPT2BPETokenizer        --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt
//                           (data/tokenizer.h, unchanged GPT-2 behaviour)
//   HuggingFaceTokenizer    --tokenizer-model tokenizer.json   (byte-level BPE: Llama 3,
//                           Qwen without NFC, GPT-NeoX; data/hf_tokenizer.h)
//   SentencePieceTokenizer  --tokenizer-model tokenizer.model  (Llama 2, Mistral; Debian
//                           libsentencepiece; data/sp_tokenizer.h)
//   Llama2Tokenizer         same .model, but encode() prepends BOS (Megatron's Llama2Tokenizer)
//   GPTSentencePieceTokenizer  same .model, plain sp.encode, eod = eos (Megatron's)
//   BertWordPieceLowerCase / BertWordPieceCase  --vocab-file vocab.txt (BERT WordPiece;
//                           data/wordpiece_tokenizer.h)
// encode() follows Megatron's `tokenizer.tokenize(text)` for each type (see each header for
// which special tokens it adds); eod() is Megatron's `tokenizer.eod`.
//
// Threading: a TextTokenizer is immutable and shared; a TextEncoder holds per-thread
// scratch, so use one per thread.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace mpitron::data {

class TextEncoder {
 public:
  virtual ~TextEncoder() = default;
  // Appends the ids of `text` to `out` (Megatron's tokenize()).
  virtual void encode(std::string_view text, std::vector<int32_t>& out) = 0;
  std::vector<int32_t> encode(std::string_view text) {
    std::vector<int32_t> out;
    encode(text, out);
    return out;
  }
};

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  virtual std::string type() const = 0;  // Megatron's --tokenizer-type name
  std::unique_ptr<TextEncoder> make_encoder() const { return make_encoder(true); }
  // add_special = false: without the BOS / template tokens the tokenizer adds around a
  // text (HF add_special_tokens=False, Llama2Tokenizer without BOS); GPT-2 and
  // SentencePieceTokenizer add none either way. For continuations such as LAMBADA targets.
  virtual std::unique_ptr<TextEncoder> make_encoder(bool add_special) const = 0;
  std::vector<int32_t> encode(std::string_view text) const { return make_encoder()->encode(text); }
  // Bytes of the ids (special tokens as their text; no UTF-8 repair).
  virtual std::string decode(const int32_t* ids, size_t n) const = 0;
  std::string decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), ids.size()); }
  virtual int64_t vocab_size() const = 0;  // incl. added tokens (len(tokenizer) in HF)
  virtual int32_t eod() const = 0;         // end of document (Megatron's tokenizer.eod)
  virtual int32_t bos() const { return -1; }  // -1 when the tokenizer has none
  // BERT's special ids (Megatron's tokenizer.cls / sep / mask / pad); -1 when absent.
  virtual int32_t cls() const { return -1; }
  virtual int32_t sep() const { return -1; }
  virtual int32_t mask() const { return -1; }
  virtual int32_t pad() const { return -1; }
  virtual int32_t token_to_id(std::string_view token) const = 0;  // -1 when absent
};

struct TokenizerSpec {
  std::string type = "GPT2BPETokenizer";
  std::string model;       // --tokenizer-model
  std::string vocab_file;  // --vocab-file  (GPT-2: defaults to assets/gpt2; BERT: vocab.txt)
  std::string merge_file;  // --merge-file
  // --vocab-extra-ids N: <extra_id_0> … <extra_id_{N−1}> appended to a WordPiece vocab (after
  // [BOS] / [EOS]), as Megatron's BertWordPieceLowerCase/Case(vocab_extra_ids=N); T5's sentinels.
  // Other types refuse N > 0.
  int64_t vocab_extra_ids = 0;
};

// Throws naming the flag when the type is unknown or a needed file is not given.
std::unique_ptr<TextTokenizer> make_tokenizer(const TokenizerSpec& spec);

// What a checkpoint records of the tokenizer it was trained with, and what training
// and the inference tools compare before using one (docs/checkpoint-format.md):
//   {"type": "GPT2BPETokenizer", "vocab_size": 50257,
//    "files": [{"name": "gpt2-vocab.json", "sha256": "…"}, {"name": "gpt2-merges.txt", "sha256": "…"}]}
// files: the vocab/merges (GPT-2; the bundled ones when none is given), vocab.txt (BERT),
// tokenizer.json and the tokenizer_config.json beside it when there is one (its eos/bos
// change the ids), tokenizer.model (SentencePiece); sha256 as `sha256sum` prints it.
// "vocab_extra_ids": N only when --vocab-extra-ids N > 0 (vocab_size then counts the sentinels).
nlohmann::json tokenizer_identity(const TokenizerSpec& spec, const TextTokenizer& tok);
// "" when both identities name the same tokenizer (type, vocab size, extra ids, the files' hashes;
// file names may differ), else what differs, for an error message.
std::string tokenizer_difference(const nlohmann::json& saved, const nlohmann::json& now);
// "GPT2BPETokenizer, 50257 tokens, gpt2-vocab.json sha256 3fa2a1…, …" for messages.
std::string describe_tokenizer_identity(const nlohmann::json& id);

// Types make_tokenizer accepts, for help texts and errors.
constexpr const char* kTokenizerTypes =
    "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, Llama2Tokenizer, GPTSentencePieceTokenizer, "
    "BertWordPieceLowerCase, BertWordPieceCase";

}  // namespace mpitron::data
