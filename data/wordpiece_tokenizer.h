// data/wordpiece_tokenizer.h — BERT WordPiece from a vocab.txt (Megatron's
// --tokenizer-type BertWordPieceLowerCase / BertWordPieceCase, --vocab-file vocab.txt).
//
// Same ids as Hugging Face `BertWordPieceTokenizer(vocab.txt, lowercase=...)
// .encode(text, add_special_tokens=False)`:
//   1. the special tokens [PAD] [UNK] [CLS] [SEP] [MASK], written as-is in the text, are
//      cut out first (leftmost, case-sensitive) and become their own ids;
//   2. BertNormalizer on each remaining segment: drop NUL, U+FFFD and control characters
//      (categories Cc Cf Cn Co Cs, but not \t \n \r); every White_Space character → ' ';
//      CJK ideographs (the BERT blocks: U+4E00–9FFF, 3400–4DBF, 20000–2A6DF, 2A700–2B73F,
//      2B740–2B81F, 2B920–2CEAF, F900–FAFF, 2F800–2FA1F) get a space on each side;
//      lower-case type only: NFD, drop nonspacing marks (Mn), then lower-case each
//      character (İ → i̇, Σ → σ, no context);
//   3. BertPreTokenizer: split on spaces (dropped) and around every punctuation character
//      (Unicode P* plus the ASCII symbols !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~), each its own word;
//   4. WordPiece: greedy longest-match-first, later pieces looked up as "##piece"; a word
//      of more than 100 characters, or one that cannot be covered, becomes [UNK].
// Unicode data (categories, White_Space, NFD, case) come from ICU (Debian libicu-dev).
//
// Megatron's tokenize() adds no [CLS] / [SEP] around a text, nor does encode() here
// (make_encoder(true) and make_encoder(false) are the same). Like Megatron's
// _BertWordPieceTokenizer, [BOS] and [EOS] are appended to the vocab when vocab.txt lacks
// them; eod() is [EOS] (Megatron's tokenizer.eod = eos), bos() is [BOS].
// extra_ids N (--vocab-extra-ids, Megatron's _BertWordPieceTokenizer(vocab_extra_ids=N)): then
// <extra_id_0> … <extra_id_{N−1}> are appended, each absent one getting the next id (add_token). They
// are special like [MASK]: "<extra_id_3>" written in the text is cut out as that one id (HF and
// Megatron's added tokens), and decode() prints it as written.
// Differences from Megatron's own Python (Google's FullTokenizer, same vocab): there a
// "[MASK]" written in the text is split as "[", "mask", "]", words may be 200 characters,
// and lower-casing comes before accent stripping; see docs/data.md.
//
// A vocab.txt that is missing, empty, has an empty line or a token twice, or lacks one of
// [PAD] [UNK] [CLS] [SEP] [MASK] is an error naming the file (and line).
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/text_tokenizer.h"

namespace mpitron::data {

class WordPieceTokenizer : public TextTokenizer {
 public:
  static constexpr int kMaxWordChars = 100;  // HF's max_input_chars_per_word

  WordPieceTokenizer(const std::string& vocab_file, bool lower_case, int64_t extra_ids = 0);

  std::string type() const override { return lower_case_ ? "BertWordPieceLowerCase" : "BertWordPieceCase"; }
  using TextTokenizer::make_encoder;
  std::unique_ptr<TextEncoder> make_encoder(bool add_special) const override;
  using TextTokenizer::decode;
  using TextTokenizer::encode;
  // Tokens joined by spaces, "##" pieces glued to the one before (HF's WordPiece decoder).
  std::string decode(const int32_t* ids, size_t n) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  int32_t eod() const override { return eos_; }
  int32_t bos() const override { return bos_; }
  int32_t cls() const override { return cls_; }
  int32_t sep() const override { return sep_; }
  int32_t mask() const override { return mask_; }
  int32_t pad() const override { return pad_; }
  int32_t unk() const { return unk_; }
  int64_t extra_ids() const { return extra_ids_; }  // the <extra_id_j> sentinels (--vocab-extra-ids)
  int32_t token_to_id(std::string_view token) const override;
  const std::string& id_to_token(int32_t id) const { return tokens_.at(static_cast<size_t>(id)); }
  // True for "##..." pieces (a word's continuation; Megatron's whole-word boundaries).
  bool is_continuation(int32_t id) const { return id_to_token(id).rfind("##", 0) == 0; }

  // Steps 2-3 alone: the normalised words of one segment without special tokens.
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  void pre_tokenize(std::string_view text, std::vector<std::string>& words) const;  // reuses `words`
  // Per-thread scratch of an encoder: word → ids (bounded), the word list.
  struct Cache;
  // Appends the ids of `text` (steps 1-4); `cache` (optional) memoises words.
  void encode_to(std::string_view text, std::vector<int32_t>& out, Cache* cache = nullptr) const;

 private:
  void wordpiece(const std::string& word, std::vector<int32_t>& out) const;
  // The special token starting at text[at] (its id and length), or id −1.
  std::pair<int32_t, size_t> special_at(std::string_view text, size_t at) const;

  bool lower_case_;
  std::string file_;
  std::vector<std::string> tokens_;                   // [vocab] id → token
  std::unordered_map<std::string, int32_t> ids_;      // token → id
  std::unordered_map<std::string, int32_t> cont_;     // "piece" → id of "##piece"
  int64_t extra_ids_ = 0;
  int32_t pad_ = -1, unk_ = -1, cls_ = -1, sep_ = -1, mask_ = -1, bos_ = -1, eos_ = -1;
  size_t max_piece_bytes_ = 0;                        // longest token, to bound the search
};

}  // namespace mpitron::data
