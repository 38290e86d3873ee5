// data/sp_tokenizer.cpp — libsentencepiece wrapper with Megatron's special tokens.
#include "data/sp_tokenizer.h"

#include <sentencepiece_processor.h>

#include <fstream>

#include "core/error.h"
#include "data/tokenizer.h"

namespace mpitron::data {

SPTokenizer::SPTokenizer(const std::string& path, Mode mode)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), mode_(mode), file_(path) {
  MPT_CHECK(std::ifstream(path).good(), str("cannot open tokenizer model '", path, "'"),
            "pass --tokenizer-model path/to/tokenizer.model");
  auto st = sp_->Load(path);
  MPT_CHECK(st.ok(), str("tokenizer model '", path, "' is not a SentencePiece model: ", st.ToString()),
            "pass a SentencePiece tokenizer.model (for a tokenizer.json use --tokenizer-type HuggingFaceTokenizer)");
  sp_size_ = sp_->GetPieceSize();
  bos_ = sp_->bos_id();
  if (mode_ != Mode::kSentencePiece) {
    MPT_CHECK(sp_->eos_id() >= 0 && (mode_ == Mode::kGPT || bos_ >= 0),
              str("tokenizer model '", path, "' has no ", mode_ == Mode::kGPT ? "eos" : "bos/eos", " piece"),
              str(type(), " needs a model trained with bos_id and eos_id; use SentencePieceTokenizer"));
    eod_ = sp_->eos_id();
    return;
  }
  int32_t next = sp_size_;
  auto add = [&](const std::string& t) {
    int32_t id = sp_->PieceToId(t);
    if (id == sp_->unk_id() && t != sp_->IdToPiece(sp_->unk_id())) {  // absent: appended after the model
      id = next++;
      added_text_[id] = t;
    }
    special_.emplace_back(t, id);
    return id;
  };
  add("<CLS>");
  add("<SEP>");
  eod_ = add("<EOD>");
  add("<MASK>");
  auto piece_or = [&](int id, const char* fallback) {
    return id >= 0 && id < sp_size_ ? sp_->IdToPiece(id) : std::string(fallback);
  };
  add(piece_or(sp_->pad_id(), "<PAD>"));
  bos_ = add(piece_or(sp_->bos_id(), "<BOS>"));
  add(piece_or(sp_->eos_id(), "<EOS>"));
}

SPTokenizer::~SPTokenizer() = default;

int64_t SPTokenizer::vocab_size() const { return sp_size_ + static_cast<int64_t>(added_text_.size()); }

int32_t SPTokenizer::token_to_id(std::string_view token) const {
  for (const auto& [t, id] : special_)
    if (t == token) return id;
  int32_t id = sp_->PieceToId(token);
  return id == sp_->unk_id() && token != sp_->IdToPiece(id) ? -1 : id;
}

void SPTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<int> ids;
  auto st = sp_->Encode(text, &ids);
  MPT_CHECK(st.ok(), str("SentencePiece '", file_, "' cannot encode: ", st.ToString()), "");
  out.insert(out.end(), ids.begin(), ids.end());
}

void SPTokenizer::encode(std::string_view text, std::vector<int32_t>& out, bool add_special) const {
  int64_t bad = find_invalid_utf8(text);
  MPT_CHECK(bad < 0, str("text is not valid UTF-8 (byte offset ", bad, ")"), "decode the input as UTF-8 before tokenising");
  if (mode_ != Mode::kSentencePiece) {
    if (add_special && mode_ == Mode::kLlama2) out.push_back(bos_);
    encode_plain(text, out);
    return;
  }
  // Megatron's loop: the earliest special token next (ties: first in order), sp-encode before it.
  size_t idx = 0;
  for (;;) {
    size_t best = std::string_view::npos;
    const std::pair<std::string, int32_t>* tok = nullptr;
    for (const auto& s : special_) {
      size_t at = text.find(s.first, idx);
      if (at != std::string_view::npos && (best == std::string_view::npos || at < best)) best = at, tok = &s;
    }
    if (!tok) break;
    encode_plain(text.substr(idx, best - idx), out);
    out.push_back(tok->second);
    idx = best + tok->first.size();
  }
  encode_plain(text.substr(idx), out);
}

std::string SPTokenizer::decode(const int32_t* ids, size_t n) const {
  std::string out, part;
  std::vector<int> run;
  auto flush = [&] {
    if (run.empty()) return;
    auto st = sp_->Decode(run, &part);
    MPT_CHECK(st.ok(), str("SentencePiece '", file_, "' cannot decode: ", st.ToString()), "");
    out += part;
    run.clear();
  };
  for (size_t i = 0; i < n; ++i) {
    MPT_CHECK(ids[i] >= 0 && ids[i] < vocab_size(),
              str("token id ", ids[i], " is outside the vocabulary [0, ", vocab_size(), ") of '", file_, "'"),
              "the ids come from a different tokenizer or a corrupt file");
    auto it = added_text_.find(ids[i]);
    if (it == added_text_.end()) {
      run.push_back(ids[i]);
    } else {
      flush();
      out += it->second;
    }
  }
  flush();
  return out;
}

namespace {
class SPEncoder : public TextEncoder {
 public:
  SPEncoder(const SPTokenizer& t, bool add_special) : t_(t), add_special_(add_special) {}
  using TextEncoder::encode;
  void encode(std::string_view text, std::vector<int32_t>& out) override { t_.encode(text, out, add_special_); }

 private:
  const SPTokenizer& t_;
  bool add_special_;
};
}  // namespace

std::unique_ptr<TextEncoder> SPTokenizer::make_encoder(bool add_special) const {
  return std::make_unique<SPEncoder>(*this, add_special);
}

}  // namespace mpitron::data
