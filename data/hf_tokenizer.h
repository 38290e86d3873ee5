// data/hf_tokenizer.h — Hugging Face tokenizer.json, byte-level BPE (Megatron's
// HuggingFaceTokenizer for Llama 3, GPT-NeoX, Qwen-without-NFC style files).
//
// Same ids as `tokenizers.Tokenizer.from_file(f).encode(text, add_special_tokens)`:
//   1. added tokens (added_tokens[], special or not) are cut out of the text first,
//      leftmost-longest, and become their own ids;
//   2. each remaining segment goes through the pre_tokenizer: "ByteLevel" (GPT-2
//      regex when use_regex, add_prefix_space) or a "Sequence" of "Split" (Regex,
//      behavior Isolated) and "ByteLevel";
//   3. each piece is BPE-merged on its bytes (rank = index in model.merges, merges as
//      "a b" strings or [a, b] pairs; ignore_merges emits a whole piece found in vocab);
//   4. with add_special, the post_processor's TemplateProcessing (single: prefix $A
//      suffix) adds its special tokens (Llama 3: <|begin_of_text|>); ByteLevel adds none.
// Megatron's tokenize() is `AutoTokenizer(text).input_ids`, i.e. add_special = true:
// that is what TextEncoder::encode does. eod() is the eos token (Megatron:
// tokenizer.eos_token_id): eos_token of tokenizer_config.json beside the file (as
// AutoTokenizer reads it), else the first special added token among <|end_of_text|>,
// <|endoftext|>, </s>, <|im_end|>, <eos>.
// Rejected with an error naming the file and key: models other than BPE, byte_fallback,
// continuing_subword_prefix / end_of_word_suffix, dropout, any normalizer (NFC included:
// no Unicode normalisation here), other pre_tokenizers / Split behaviours / decoders /
// post_processors, added tokens with lstrip / rstrip / single_word.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>

#include "data/text_tokenizer.h"

namespace mpitron::data {

class HFTokenizer : public TextTokenizer {
 public:
  explicit HFTokenizer(const std::string& tokenizer_json);
  ~HFTokenizer() override;

  std::string type() const override { return "HuggingFaceTokenizer"; }
  using TextTokenizer::make_encoder;
  // add_special = false: HF's encode(text, add_special_tokens=False).
  std::unique_ptr<TextEncoder> make_encoder(bool add_special) const override;
  using TextTokenizer::decode;
  using TextTokenizer::encode;
  std::string decode(const int32_t* ids, size_t n) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_bytes_.size()); }
  int32_t eod() const override;
  int32_t bos() const override { return bos_; }
  int32_t token_to_id(std::string_view token) const override;

 private:
  friend class HFEncoder;
  void load(const std::string& path);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> id_to_bytes_;  // [vocab] raw bytes (added tokens: their content)
  int32_t bos_ = -1, eos_ = -1;
  std::string file_;
};

}  // namespace mpitron::data
