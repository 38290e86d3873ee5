// data/text_tokenizer.cpp — the factory and the GPT-2 adapter.
#include "data/text_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/sha256.h"
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
  const bool wordpiece = s.type == "BertWordPieceLowerCase" || s.type == "BertWordPieceCase";
  MPT_CHECK(s.vocab_extra_ids >= 0, str("--vocab-extra-ids must be >= 0, got ", s.vocab_extra_ids), "");
  MPT_CHECK(wordpiece || s.vocab_extra_ids == 0,
            str("--vocab-extra-ids ", s.vocab_extra_ids, ": ", s.type,
                " is not a WordPiece tokenizer (the sentinels are built for BertWordPieceLowerCase / BertWordPieceCase)"),
            "drop --vocab-extra-ids, or use a WordPiece vocab.txt (T5)");
  if (s.type == "GPT2BPETokenizer") {
    MPT_CHECK(s.model.empty(), "--tokenizer-model is not used by GPT2BPETokenizer",
              "pass --vocab-file and --merge-file, or --tokenizer-type HuggingFaceTokenizer / SentencePieceTokenizer");
    return std::make_unique<GPT2Adapter>(s.vocab_file.empty() ? Tokenizer::default_vocab_file() : s.vocab_file,
                                         s.merge_file.empty() ? Tokenizer::default_merges_file() : s.merge_file);
  }
  if (wordpiece) {
    MPT_CHECK(!s.vocab_file.empty(), str("--tokenizer-type ", s.type, " needs --vocab-file"),
              "pass --vocab-file path/to/vocab.txt (the BERT WordPiece vocab, one token per line)");
    MPT_CHECK(s.model.empty() && s.merge_file.empty(),
              str("--tokenizer-model / --merge-file are not used by ", s.type), "drop them; pass only --vocab-file vocab.txt");
    return std::make_unique<WordPieceTokenizer>(s.vocab_file, s.type == "BertWordPieceLowerCase", s.vocab_extra_ids);
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

nlohmann::json tokenizer_identity(const TokenizerSpec& s, const TextTokenizer& tok) {
  std::vector<std::string> files;
  if (s.type == "GPT2BPETokenizer") {
    files = {s.vocab_file.empty() ? Tokenizer::default_vocab_file() : s.vocab_file,
             s.merge_file.empty() ? Tokenizer::default_merges_file() : s.merge_file};
  } else if (!s.vocab_file.empty()) {
    files = {s.vocab_file};
  } else {
    files = {s.model};
    if (s.type == "HuggingFaceTokenizer") {
      const std::string cfg = (std::filesystem::path(s.model).parent_path() / "tokenizer_config.json").string();
      if (std::filesystem::exists(cfg)) files.push_back(cfg);
    }
  }
  nlohmann::json j = {{"type", tok.type()}, {"vocab_size", tok.vocab_size()}, {"files", nlohmann::json::array()}};
  if (s.vocab_extra_ids > 0) j["vocab_extra_ids"] = s.vocab_extra_ids;  // absent at 0: older identities unchanged
  for (const std::string& f : files)
    j["files"].push_back({{"name", std::filesystem::path(f).filename().string()}, {"sha256", sha256_file(f)}});
  return j;
}

std::string tokenizer_difference(const nlohmann::json& saved, const nlohmann::json& now) {
  std::string d;
  const auto add = [&](const std::string& s) { d += (d.empty() ? "" : ", ") + s; };
  if (saved.value("type", "") != now.value("type", ""))
    add(str("type ", saved.value("type", "?"), " -> ", now.value("type", "?")));
  if (saved.value("vocab_size", int64_t{-1}) != now.value("vocab_size", int64_t{-1}))
    add(str("vocab_size ", saved.value("vocab_size", int64_t{-1}), " -> ", now.value("vocab_size", int64_t{-1})));
  if (saved.value("vocab_extra_ids", int64_t{0}) != now.value("vocab_extra_ids", int64_t{0}))
    add(str("--vocab-extra-ids ", saved.value("vocab_extra_ids", int64_t{0}), " -> ", now.value("vocab_extra_ids", int64_t{0})));
  std::vector<std::string> a, b;
  for (const auto& f : saved.value("files", nlohmann::json::array())) a.push_back(f.value("sha256", ""));
  for (const auto& f : now.value("files", nlohmann::json::array())) b.push_back(f.value("sha256", ""));
  if (a != b) add("the tokenizer files' contents (sha256)");
  return d;
}

std::string describe_tokenizer_identity(const nlohmann::json& id) {
  std::string s = str(id.value("type", "?"), ", ", id.value("vocab_size", int64_t{-1}), " tokens");
  if (id.value("vocab_extra_ids", int64_t{0}) > 0)
    s += str(" (with --vocab-extra-ids ", id.value("vocab_extra_ids", int64_t{0}), " sentinels)");
  for (const auto& f : id.value("files", nlohmann::json::array()))
    s += str(", ", f.value("name", "?"), " sha256 ", f.value("sha256", "").substr(0, 12), "...");
  return s;
}

}  // namespace mpitron::data
