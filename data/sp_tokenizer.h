// data/sp_tokenizer.h — SentencePiece .model files through Debian's libsentencepiece
// (Llama 2, Mistral), with Megatron's two semantics:
//
// SentencePieceTokenizer (Megatron's _SentencePieceTokenizer):
//   the vocabulary is the model's pieces plus, when absent, <CLS> <SEP> <EOD> <MASK>,
//   the pad / bos / eos pieces (<PAD> <BOS> <EOS> when the model has none) appended in
//   that order; tokenize() cuts those special tokens out of the text (earliest first,
//   ties in that order) and sp-encodes the rest without BOS/EOS; eod() is <EOD>
//   (an added id: sp_size + 2 for a model with <s> </s>), vocab_size() counts the
//   added tokens. (--vocab-extra-ids is not built.)
// Llama2Tokenizer (Megatron's Llama2Tokenizer): tokenize() = [bos] + sp.encode(text)
//   (special tokens in text are ordinary text), eod() = eos_id, vocab_size() = the
//   model's piece count.
// GPTSentencePieceTokenizer (Megatron's _GPTSentencePieceTokenizer): tokenize() =
//   sp.encode(text), eod() = eos_id, vocab_size() = the model's piece count.
// decode: sp.decode of the pieces, special added tokens as their text.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/text_tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace mpitron::data {

class SPTokenizer : public TextTokenizer {
 public:
  enum class Mode { kSentencePiece, kLlama2, kGPT };  // the three Megatron classes above
  SPTokenizer(const std::string& model_file, Mode mode);
  ~SPTokenizer() override;

  std::string type() const override {
    return mode_ == Mode::kLlama2 ? "Llama2Tokenizer" : mode_ == Mode::kGPT ? "GPTSentencePieceTokenizer" : "SentencePieceTokenizer";
  }
  using TextTokenizer::make_encoder;
  std::unique_ptr<TextEncoder> make_encoder(bool add_special) const override;
  using TextTokenizer::decode;
  using TextTokenizer::encode;
  std::string decode(const int32_t* ids, size_t n) const override;
  int64_t vocab_size() const override;
  int32_t eod() const override { return eod_; }
  int32_t bos() const override { return bos_; }
  int32_t token_to_id(std::string_view token) const override;

  // sp.encode(text) alone (no special-token cut, no BOS).
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  void encode(std::string_view text, std::vector<int32_t>& out, bool add_special = true) const;  // tokenize()

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  Mode mode_;
  int32_t sp_size_ = 0, bos_ = -1, eod_ = -1;
  std::vector<std::pair<std::string, int32_t>> special_;  // Megatron's _special_tokens, in order
  std::unordered_map<int32_t, std::string> added_text_;   // ids beyond the model → text
  std::string file_;
};

}  // namespace mpitron::data
