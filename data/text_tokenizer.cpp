// data/text_tokenizer.cpp — the factory and the GPT-2 adapter.
#include "data/text_tokenizer.h"

#include "core/error.h"
#include "data/hf_tokenizer.h"
#include "data/sp_tokenizer.h"
#include "data/tokenizer.h"
#include "data/wordpiece_tokenizer.h"

namespace mpitron::data {

namespace {

class GPT2Adapter : public TextTokenizer {
 public:
  GPT2Adapter(const std::string& vocab, const std::string& merges) : tok_(vocab, merges) {}
  std::string type() const override { return "GPT2BPETokenizer"; }
  std::unique_ptr<TextEncoder> make_encoder(bool) const override { return std::make_unique<Enc>(tok_); }
  std::string decode(const int32_t* ids, size_t n) const override { return tok_.decode(ids, n); }
  int64_t vocab_size() const override { return tok_.vocab_size(); }
  int32_t eod() const override { return tok_.eod(); }
  int32_t token_to_id(std::string_view token) const override {
    if (token == "<|endoftext|>") return tok_.eod();
    auto ids = tok_.encode(token);  // a token whose bytes BPE to exactly one id
    return ids.size() == 1 && tok_.token_bytes(ids[0]) == token ? ids[0] : -1;
  }

 private:
  struct Enc : TextEncoder {
    explicit Enc(const Tokenizer& t) : e(t) {}
    using TextEncoder::encode;
    void encode(std::string_view text, std::vector<int32_t>& out) override { e.encode(text, out); }
    Encoder e;
  };
  Tokenizer tok_;
};

}  // namespace

std::unique_ptr<TextTokenizer> make_tokenizer(const TokenizerSpec& s) {
  if (s.type == "GPT2BPETokenizer") {
    MPT_CHECK(s.model.empty(), "--tokenizer-model is not used by GPT2BPETokenizer",
              "pass --vocab-file and --merge-file, or --tokenizer-type HuggingFaceTokenizer / SentencePieceTokenizer");
    return std::make_unique<GPT2Adapter>(s.vocab_file.empty() ? Tokenizer::default_vocab_file() : s.vocab_file,
                                         s.merge_file.empty() ? Tokenizer::default_merges_file() : s.merge_file);
  }
  if (s.type == "BertWordPieceLowerCase" || s.type == "BertWordPieceCase") {
    MPT_CHECK(!s.vocab_file.empty(), str("--tokenizer-type ", s.type, " needs --vocab-file"),
              "pass --vocab-file path/to/vocab.txt (the BERT WordPiece vocab, one token per line)");
    MPT_CHECK(s.model.empty() && s.merge_file.empty(),
              str("--tokenizer-model / --merge-file are not used by ", s.type), "drop them; pass only --vocab-file vocab.txt");
    return std::make_unique<WordPieceTokenizer>(s.vocab_file, s.type == "BertWordPieceLowerCase");
  }
  const bool hf = s.type == "HuggingFaceTokenizer";
  const bool sp = s.type == "SentencePieceTokenizer" || s.type == "Llama2Tokenizer" || s.type == "GPTSentencePieceTokenizer";
  MPT_CHECK(hf || sp, str("--tokenizer-type ", s.type, " is not built in mpitron"), str("use one of ", kTokenizerTypes));
  MPT_CHECK(!s.model.empty(), str("--tokenizer-type ", s.type, " needs --tokenizer-model"),
            hf ? "pass --tokenizer-model path/to/tokenizer.json" : "pass --tokenizer-model path/to/tokenizer.model");
  MPT_CHECK(s.vocab_file.empty() && s.merge_file.empty(),
            str("--vocab-file / --merge-file are GPT2BPETokenizer's; ", s.type, " reads only --tokenizer-model"),
            "drop --vocab-file and --merge-file");
  if (hf) return std::make_unique<HFTokenizer>(s.model);
  return std::make_unique<SPTokenizer>(s.model, s.type == "Llama2Tokenizer"      ? SPTokenizer::Mode::kLlama2
                                                : s.type == "GPTSentencePieceTokenizer" ? SPTokenizer::Mode::kGPT
                                                                                        : SPTokenizer::Mode::kSentencePiece);
}

}  // namespace mpitron::data
