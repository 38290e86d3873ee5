// data/wordpiece_tokenizer.cpp — BERT basic tokenizer + WordPiece (see the header for
// the rules and the reference they follow).
#include "data/wordpiece_tokenizer.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>

#include <algorithm>
#include <fstream>

#include "core/error.h"
#include "data/tokenizer.h"  // find_invalid_utf8
#include "data/utf8.h"

namespace mpitron::data {

namespace {

constexpr const char* kSpecials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};

bool is_bert_whitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= '\t' && c <= '\r');  // VT and FF are dropped as controls first
  return u_isUWhiteSpace(c);
}

// Cc Cf Cn Co Cs, but \t \n \r count as whitespace (HF's is_control).
bool is_bert_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  if (c < 0x80) return c < 0x20 || c == 0x7F;
  switch (u_charType(c)) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_UNASSIGNED:
    case U_PRIVATE_USE_CHAR:
    case U_SURROGATE:
      return true;
    default:
      return false;
  }
}

bool is_bert_punct(char32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  return u_ispunct(c);
}

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// NFD of a code point sequence (ICU works on UTF-16).
std::u32string nfd(const std::u32string& in) {
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* n = unorm2_getNFDInstance(&err);
  MPT_CHECK(U_SUCCESS(err), "ICU has no NFD data", "reinstall libicu (scripts/install-deps.sh)");
  std::u16string src;
  for (char32_t c : in) {
    if (c < 0x10000) {
      src += static_cast<char16_t>(c);
    } else {
      src += static_cast<char16_t>(0xD800 + ((c - 0x10000) >> 10));
      src += static_cast<char16_t>(0xDC00 + ((c - 0x10000) & 0x3FF));
    }
  }
  std::u16string dst(src.size() + src.size() / 2 + 16, u'\0');  // grown below if NFD expands more
  int32_t len = unorm2_normalize(n, reinterpret_cast<const UChar*>(src.data()), static_cast<int32_t>(src.size()),
                                 reinterpret_cast<UChar*>(dst.data()), static_cast<int32_t>(dst.size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    err = U_ZERO_ERROR;
    dst.assign(static_cast<size_t>(len), u'\0');
    len = unorm2_normalize(n, reinterpret_cast<const UChar*>(src.data()), static_cast<int32_t>(src.size()),
                           reinterpret_cast<UChar*>(dst.data()), len, &err);
  }
  MPT_CHECK(U_SUCCESS(err), str("ICU NFD failed: ", u_errorName(err)), "");
  std::u32string out;
  out.reserve(static_cast<size_t>(len));
  for (int32_t i = 0; i < len; ++i) {
    char32_t c = dst[i];
    if (c >= 0xD800 && c < 0xDC00 && i + 1 < len) c = 0x10000 + ((c - 0xD800) << 10) + (dst[++i] - 0xDC00);
    out += c;
  }
  return out;
}

}  // namespace

struct WordPieceTokenizer::Cache {
  static constexpr size_t kMaxEntries = 1 << 16;  // cleared when full
  std::unordered_map<std::string, std::vector<int32_t>> ids;
  std::vector<std::string> words;
};

namespace {

class WPEncoder : public TextEncoder {
 public:
  explicit WPEncoder(const WordPieceTokenizer& t) : t_(t) {}
  using TextEncoder::encode;
  void encode(std::string_view text, std::vector<int32_t>& out) override { t_.encode_to(text, out, &cache_); }

 private:
  const WordPieceTokenizer& t_;
  WordPieceTokenizer::Cache cache_;
};

}  // namespace

WordPieceTokenizer::WordPieceTokenizer(const std::string& vocab_file, bool lower_case, int64_t extra_ids)
    : lower_case_(lower_case), file_(vocab_file), extra_ids_(extra_ids) {
  MPT_CHECK(extra_ids >= 0 && extra_ids <= 1000000, str("--vocab-extra-ids ", extra_ids, " is out of range"),
            "pass 0 (none) or the sentinel count, 100 for Megatron's T5");
  std::ifstream f(vocab_file, std::ios::binary);
  MPT_CHECK(f.good(), str("cannot open --vocab-file '", vocab_file, "'"),
            "pass the BERT vocab.txt (one WordPiece token per line)");
  std::string line;
  int64_t line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    MPT_CHECK(!line.empty(), str(vocab_file, ":", line_no, ": empty line in the vocab"),
              "a BERT vocab.txt has one non-empty token per line (the id is the line number - 1)");
    MPT_CHECK(find_invalid_utf8(line) < 0, str(vocab_file, ":", line_no, ": token is not UTF-8"), "");
    auto [it, fresh] = ids_.emplace(line, static_cast<int32_t>(tokens_.size()));
    MPT_CHECK(fresh, str(vocab_file, ":", line_no, ": token '", line, "' is already on line ", it->second + 1),
              "each token must appear once in vocab.txt");
    tokens_.push_back(line);
  }
  MPT_CHECK(!tokens_.empty(), str("--vocab-file '", vocab_file, "' is empty"), "pass a BERT vocab.txt");
  std::string missing;
  for (const char* s : kSpecials)
    if (!ids_.count(s)) missing += str(missing.empty() ? "" : " ", s);
  MPT_CHECK(missing.empty(), str("--vocab-file '", vocab_file, "' lacks the special token(s) ", missing),
            "a BERT vocab.txt must hold [PAD] [UNK] [CLS] [SEP] [MASK]");
  pad_ = ids_["[PAD]"], unk_ = ids_["[UNK]"], cls_ = ids_["[CLS]"], sep_ = ids_["[SEP]"], mask_ = ids_["[MASK]"];
  for (const auto& t : tokens_) {
    max_piece_bytes_ = std::max(max_piece_bytes_, t.size());
    if (t.rfind("##", 0) == 0) cont_.emplace(t.substr(2), ids_[t]);
  }
  // Megatron's _BertWordPieceTokenizer.add_token: [BOS], [EOS] appended when absent.
  for (const char* s : {"[BOS]", "[EOS]"}) {
    if (!ids_.count(s)) {
      ids_.emplace(s, static_cast<int32_t>(tokens_.size()));
      tokens_.push_back(s);
    }
  }
  bos_ = ids_["[BOS]"], eos_ = ids_["[EOS]"];
  // Then the --vocab-extra-ids sentinels, in order, each absent one at the next id (add_token).
  for (int64_t j = 0; j < extra_ids; ++j) {
    const std::string s = "<extra_id_" + std::to_string(j) + ">";
    if (!ids_.count(s)) {
      ids_.emplace(s, static_cast<int32_t>(tokens_.size()));
      tokens_.push_back(s);
    }
  }
}

std::unique_ptr<TextEncoder> WordPieceTokenizer::make_encoder(bool) const { return std::make_unique<WPEncoder>(*this); }

int32_t WordPieceTokenizer::token_to_id(std::string_view token) const {
  auto it = ids_.find(std::string(token));
  return it == ids_.end() ? -1 : it->second;
}

std::string WordPieceTokenizer::decode(const int32_t* ids, size_t n) const {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    MPT_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), str("token id ", ids[i], " is outside the vocab of ", file_),
              str("ids must be in [0, ", vocab_size(), ")"));
    const std::string& t = tokens_[static_cast<size_t>(ids[i])];
    if (t.rfind("##", 0) == 0) {
      out.append(t, 2, std::string::npos);
    } else {
      if (i > 0) out += ' ';
      out += t;
    }
  }
  return out;
}

std::vector<std::string> WordPieceTokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> words;
  pre_tokenize(text, words);
  return words;
}

void WordPieceTokenizer::pre_tokenize(std::string_view text, std::vector<std::string>& words) const {
  words.clear();
  // ASCII text needs no Unicode tables and no NFD: the same rules, byte by byte.
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    std::string cur;
    for (char ch : text) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        if (!cur.empty()) words.push_back(std::move(cur)), cur.clear();
      } else if (c < 0x20 || c == 0x7F) {
        continue;  // control characters (VT, FF, NUL, ...) are dropped
      } else if (is_bert_punct(c)) {
        if (!cur.empty()) words.push_back(std::move(cur)), cur.clear();
        words.emplace_back(1, ch);
      } else {
        cur += lower_case_ && c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : ch;
      }
    }
    if (!cur.empty()) words.push_back(std::move(cur));
    return;
  }
  // BertNormalizer: clean text, pad CJK, (lower-case type) NFD + drop Mn + lower-case.
  std::u32string norm;
  norm.reserve(text.size());
  bool needs_nfd = false;
  for (size_t i = 0; i < text.size();) {
    const char32_t c = next_cp(text, i);
    if (c == 0 || c == 0xFFFD || is_bert_control(c)) continue;
    if (is_bert_whitespace(c)) {
      norm += U' ';
    } else if (is_cjk(c)) {
      norm += U' ';
      norm += c;
      norm += U' ';
    } else {
      norm += c;
    }
    needs_nfd |= c >= 0xC0;
  }
  if (lower_case_) {
    if (needs_nfd) norm = nfd(norm);
    std::u32string low;
    low.reserve(norm.size());
    for (char32_t c : norm) {
      if (c >= 0x80 && u_charType(c) == U_NON_SPACING_MARK) continue;
      if (c < 0x80) {
        low += (c >= 'A' && c <= 'Z') ? c + 32 : c;
      } else if (c == 0x130) {  // the one full lower-case mapping longer than one character
        low += U'i';
        low += U'\u0307';
      } else {
        low += static_cast<char32_t>(u_tolower(static_cast<UChar32>(c)));
      }
    }
    norm.swap(low);
  }
  // BertPreTokenizer: split on whitespace (removed) and punctuation (isolated).
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) words.push_back(std::move(cur));
    cur.clear();
  };
  for (char32_t c : norm) {
    if (c == U' ' || (c >= 0x80 && u_isUWhiteSpace(c))) {
      flush();
    } else if (is_bert_punct(c)) {
      flush();
      put_cp(c, cur);
      flush();
    } else {
      put_cp(c, cur);
    }
  }
  flush();
}

void WordPieceTokenizer::wordpiece(const std::string& word, std::vector<int32_t>& out) const {
  // Code point starts (and the end), to cut pieces on character boundaries.
  std::vector<size_t> cuts;
  for (size_t i = 0; i < word.size(); ++i)
    if ((static_cast<unsigned char>(word[i]) & 0xC0) != 0x80) cuts.push_back(i);
  if (static_cast<int>(cuts.size()) > kMaxWordChars) {
    out.push_back(unk_);
    return;
  }
  cuts.push_back(word.size());
  const size_t mark = out.size();
  std::string piece;
  size_t start = 0;  // index into cuts
  while (start + 1 < cuts.size()) {
    int32_t found = -1;
    size_t end = cuts.size() - 1;
    for (; end > start; --end) {
      const size_t len = cuts[end] - cuts[start];
      if (len > max_piece_bytes_) continue;
      piece.assign(word, cuts[start], len);
      const auto& map = start == 0 ? ids_ : cont_;
      auto it = map.find(piece);
      if (it != map.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) {  // the word cannot be covered: all of it is [UNK]
      out.resize(mark);
      out.push_back(unk_);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

void WordPieceTokenizer::encode_to(std::string_view text, std::vector<int32_t>& out, Cache* cache) const {
  // Special tokens written in the text are cut out first (HF's added vocabulary).
  size_t pos = 0;
  Cache local;
  Cache& c = cache ? *cache : local;
  auto segment = [&](std::string_view s) {
    pre_tokenize(s, c.words);
    for (const std::string& w : c.words) {
      if (!cache) {
        wordpiece(w, out);
        continue;
      }
      auto it = c.ids.find(w);
      if (it == c.ids.end()) {
        if (c.ids.size() >= Cache::kMaxEntries) c.ids.clear();
        std::vector<int32_t> ids;
        wordpiece(w, ids);
        it = c.ids.emplace(w, std::move(ids)).first;
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
  };
  while (pos < text.size()) {
    size_t at = text.find_first_of(extra_ids_ > 0 ? "[<" : "[", pos);
    std::pair<int32_t, size_t> sp{-1, 0};
    while (at != std::string_view::npos && (sp = special_at(text, at)).first < 0)
      at = text.find_first_of(extra_ids_ > 0 ? "[<" : "[", at + 1);
    if (sp.first < 0) {
      segment(text.substr(pos));
      break;
    }
    segment(text.substr(pos, at - pos));
    out.push_back(sp.first);
    pos = at + sp.second;
  }
}

std::pair<int32_t, size_t> WordPieceTokenizer::special_at(std::string_view text, size_t at) const {
  if (text[at] == '[') {
    for (const char* s : kSpecials) {
      const std::string_view sv(s);
      if (text.compare(at, sv.size(), sv) == 0) return {ids_.at(s), sv.size()};
    }
    return {-1, 0};
  }
  // "<extra_id_J>" with J < extra_ids_ (digits as written: "<extra_id_03>" is not a sentinel).
  constexpr std::string_view kPrefix = "<extra_id_";
  if (text.compare(at, kPrefix.size(), kPrefix) != 0) return {-1, 0};
  const size_t close = text.find('>', at + kPrefix.size());
  if (close == std::string_view::npos || close - at > kPrefix.size() + 8) return {-1, 0};
  const std::string_view digits = text.substr(at + kPrefix.size(), close - at - kPrefix.size());
  if (digits.empty() || (digits.size() > 1 && digits[0] == '0') ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return {-1, 0};
  if (std::stoll(std::string(digits)) >= extra_ids_) return {-1, 0};
  return {ids_.at(std::string(text.substr(at, close - at + 1))), close - at + 1};
}

}  // namespace mpitron::data
