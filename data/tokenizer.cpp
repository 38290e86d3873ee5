// data/tokenizer.cpp — GPT-2 byte-level BPE: PCRE2 pre-tokeniser, merge-rank
// hash table, per-Encoder word cache.
#include "data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "core/json.h"
#include "data/bpe_heap.h"

#ifndef MPITRON_ASSETS_DIR
#define MPITRON_ASSETS_DIR "assets"
#endif

namespace mpitron::data {

namespace {

// GPT-2 pre-tokenisation pattern (OpenAI encoder.py; HF ByteLevel use_regex).
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  MPT_CHECK(f.good(), str("cannot open ", what, " '", path, "'"),
            "pass --vocab-file / --merge-file, or check the path");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// GPT-2 bytes_to_unicode: printable bytes map to themselves, the other 68 to
// U+0100.. in byte order. Returns code point → byte, -1 when not a byte char.
std::vector<int> unicode_to_byte_table() {
  std::vector<int> table(512, -1);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    int cp = printable ? b : 256 + n++;
    table[cp] = b;
  }
  return table;
}

// Decodes a (valid) UTF-8 string of byte-level characters back to raw bytes.
bool byte_level_to_bytes(const std::string& s, const std::vector<int>& u2b, std::string& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F);
      i += 2;
    } else {
      return false;  // byte-level chars are all < U+0800
    }
    if (cp >= u2b.size() || u2b[cp] < 0) return false;
    out.push_back(static_cast<char>(u2b[cp]));
  }
  return true;
}

inline uint64_t fnv1a(const char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

// ---- merge table: (left, right) → (rank, merged id) --------------------------------
struct Tokenizer::MergeTable {
  struct Slot {
    uint64_t key;  // left << 32 | right; kEmpty when free
    uint32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~0ull;
  std::vector<Slot> slots;
  uint64_t mask = 0;
  int shift = 0;

  explicit MergeTable(size_t n) {
    size_t cap = 1;
    int bits = 0;
    while (cap < 2 * n + 16) cap <<= 1, ++bits;
    slots.assign(cap, Slot{kEmpty, 0, 0});
    mask = cap - 1;
    shift = 64 - bits;
  }
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t home(uint64_t k) const { return (k * 0x9E3779B97F4A7C15ull) >> shift; }
  bool insert(uint64_t k, uint32_t rank, int32_t merged) {
    for (size_t i = home(k);; i = (i + 1) & mask) {
      if (slots[i].key == kEmpty) {
        slots[i] = Slot{k, rank, merged};
        return true;
      }
      if (slots[i].key == k) return false;  // duplicate merge: first (lowest rank) wins
    }
  }
  const Slot* find(uint64_t k) const {
    for (size_t i = home(k);; i = (i + 1) & mask) {
      if (slots[i].key == k) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }
};

// ---- Tokenizer ---------------------------------------------------------------------
std::string Tokenizer::default_vocab_file() {
  const char* env = std::getenv("MPITRON_ASSETS_DIR");
  return std::string(env ? env : MPITRON_ASSETS_DIR) + "/gpt2/gpt2-vocab.json";
}
std::string Tokenizer::default_merges_file() {
  const char* env = std::getenv("MPITRON_ASSETS_DIR");
  return std::string(env ? env : MPITRON_ASSETS_DIR) + "/gpt2/gpt2-merges.txt";
}

Tokenizer::Tokenizer(const std::string& vocab_file, const std::string& merges_file)
    : vocab_file_(vocab_file) {
  const std::vector<int> u2b = unicode_to_byte_table();

  // Vocab: JSON object {token: id}, ids dense 0..n-1.
  const nlohmann::json vocab = parse_json_text(read_file(vocab_file, "vocab file"), str("vocab file '", vocab_file, "'"));
  MPT_CHECK(vocab.is_object() && !vocab.empty(),
            str("vocab file '", vocab_file, "' is not a JSON object of token → id"), "");
  id_to_bytes_.assign(vocab.size(), std::string());
  std::vector<bool> seen(vocab.size(), false);
  std::unordered_map<std::string, int32_t> bytes_to_id;
  bytes_to_id.reserve(vocab.size() * 2);
  std::string raw;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    MPT_CHECK(it.value().is_number_integer(),
              str("vocab file '", vocab_file, "': id of token '", it.key(), "' is not an integer"), "");
    int64_t id = it.value().get<int64_t>();
    MPT_CHECK(id >= 0 && id < static_cast<int64_t>(vocab.size()) && !seen[id],
              str("vocab file '", vocab_file, "': token '", it.key(), "' has id ", id,
                  " (ids must be unique and in [0, ", vocab.size(), "))"),
              "");
    seen[id] = true;
    if (it.key() == "<|endoftext|>") {
      eod_ = static_cast<int32_t>(id);
      id_to_bytes_[id] = it.key();  // decodes to its literal text
      continue;                     // never produced by BPE (matches Megatron)
    }
    MPT_CHECK(byte_level_to_bytes(it.key(), u2b, raw),
              str("vocab file '", vocab_file, "': token '", it.key(),
                  "' is not made of GPT-2 byte-level characters"),
              "this tokenizer reads byte-level BPE vocabularies (GPT-2)");
    id_to_bytes_[id] = raw;
    bytes_to_id.emplace(raw, static_cast<int32_t>(id));
  }
  MPT_CHECK(eod_ >= 0, str("vocab file '", vocab_file, "' has no <|endoftext|> token"), "");
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_to_id.find(std::string(1, static_cast<char>(b)));
    MPT_CHECK(it != bytes_to_id.end(),
              str("vocab file '", vocab_file, "' lacks the single-byte token for byte ", b), "");
    byte_id_[b] = it->second;
  }

  // Merges: "left right" per line; rank = index after the "#version" line.
  const std::string text = read_file(merges_file, "merges file");
  std::vector<std::pair<size_t, size_t>> lines;  // [begin, end)
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    size_t end = nl;
    if (end > pos && text[end - 1] == '\r') --end;
    lines.emplace_back(pos, end);
    pos = nl + 1;
  }
  merges_ = std::make_unique<MergeTable>(lines.size());
  std::vector<bool> made(id_to_bytes_.size(), false);  // vocab ids some merge produces
  uint32_t rank = 0;
  std::string a, b;
  for (size_t li = 0; li < lines.size(); ++li) {
    std::string_view line(text.data() + lines[li].first, lines[li].second - lines[li].first);
    if (line.empty()) continue;
    if (li == 0 && line.rfind("#version", 0) == 0) continue;
    size_t sp = line.find(' ');
    MPT_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                  line.find(' ', sp + 1) == std::string_view::npos,
              str("merges file '", merges_file, "' line ", li + 1, ": expected 'left right', got '",
                  line, "'"),
              "");
    bool ok = byte_level_to_bytes(std::string(line.substr(0, sp)), u2b, a) &&
              byte_level_to_bytes(std::string(line.substr(sp + 1)), u2b, b);
    MPT_CHECK(ok, str("merges file '", merges_file, "' line ", li + 1, ": not byte-level characters"), "");
    auto ia = bytes_to_id.find(a), ib = bytes_to_id.find(b), im = bytes_to_id.find(a + b);
    MPT_CHECK(ia != bytes_to_id.end() && ib != bytes_to_id.end() && im != bytes_to_id.end(),
              str("merges file '", merges_file, "' line ", li + 1, ": merge '", line,
                  "' uses or makes a token missing from the vocab '", vocab_file, "'"),
              "vocab and merges files must come from the same tokenizer");
    merges_->insert(MergeTable::key(ia->second, ib->second), rank++, im->second);
    made[static_cast<size_t>(im->second)] = true;
  }
  // Sanity: in a byte-level BPE every vocab token of two or more bytes is made
  // by a merge (GPT-2: 256 bytes + 50000 merges + <|endoftext|> = 50257). A
  // truncated merges file leaves tokens unreachable and would tokenize differently.
  int64_t unreachable = 0;
  std::string first_unreachable;
  for (size_t id = 0; id < id_to_bytes_.size(); ++id) {
    if (static_cast<int32_t>(id) == eod_ || id_to_bytes_[id].size() < 2 || made[id]) continue;
    if (unreachable++ == 0) first_unreachable = id_to_bytes_[id];
  }
  MPT_CHECK(unreachable == 0,
            str("merges file '", merges_file, "' has ", rank, " merges, but ", unreachable, " of the ",
                id_to_bytes_.size(), " tokens of the vocab '", vocab_file, "' are made by none of them (e.g. '",
                first_unreachable, "', id ", bytes_to_id.at(first_unreachable), "): the merges file is truncated ",
                "or belongs to another vocab"),
            "use the merges file that came with the vocab (GPT-2: 50000 merges for 50257 tokens)");

  int err = 0;
  PCRE2_SIZE erroff = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &erroff, nullptr);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    MPT_THROW(str("cannot compile the GPT-2 pre-tokeniser regex: ", reinterpret_cast<char*>(msg)),
              "PCRE2 must be built with Unicode support");
  }
  MPT_CHECK(pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0,
            "PCRE2 JIT compilation of the GPT-2 regex failed", "PCRE2 must be built with JIT support");
  regex_ = re;
}

Tokenizer::~Tokenizer() {
  if (regex_) pcre2_code_free(static_cast<pcre2_code*>(regex_));
}

std::unique_ptr<Encoder> Tokenizer::make_encoder() const { return std::make_unique<Encoder>(*this); }

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  Encoder enc(*this);
  return enc.encode(text);
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  MPT_CHECK(id >= 0 && id < vocab_size(),
            str("token id ", id, " is outside the vocabulary [0, ", vocab_size(), ") of '", vocab_file_, "'"),
            "the ids come from a different tokenizer or a corrupt file");
  return id_to_bytes_[id];
}

std::string Tokenizer::decode(const int32_t* ids, size_t n) const {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += token_bytes(ids[i]);
  return out;
}
std::string Tokenizer::decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), ids.size()); }

void Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& sym, std::vector<int32_t>& out) const {
  if (piece.size() > 64) {
    bpe_long(piece, out);
    return;
  }
  sym.resize(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) sym[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  size_t n = sym.size();
  while (n > 1) {
    // Find the adjacent pair of lowest rank, then merge all its occurrences
    // left to right (GPT-2's encoder.py; identical to HF's pair queue because a
    // pair made by a merge always has a higher rank than that merge).
    uint32_t best = UINT32_MAX;
    int32_t left = 0, right = 0, merged = 0;
    for (size_t i = 0; i + 1 < n; ++i) {
      const MergeTable::Slot* s = merges_->find(MergeTable::key(sym[i], sym[i + 1]));
      if (s && s->rank < best) {
        best = s->rank;
        left = sym[i];
        right = sym[i + 1];
        merged = s->merged;
      }
    }
    if (best == UINT32_MAX) break;
    size_t w = 0;
    for (size_t i = 0; i < n;) {
      if (i + 1 < n && sym[i] == left && sym[i + 1] == right) {
        sym[w++] = merged;
        i += 2;
      } else {
        sym[w++] = sym[i++];
      }
    }
    n = w;
  }
  out.insert(out.end(), sym.begin(), sym.begin() + n);
}

// Long pieces (runs of letters or punctuation without spaces, e.g. base64 or
// URLs) would make the rescanning loop above O(n^2): merge them with a linked
// list and a min-heap of (rank, position) instead, O(n log n). Same result: a
// pair created by a merge always ranks after that merge, and equal ranks pop
// left to right.
void Tokenizer::bpe_long(std::string_view piece, std::vector<int32_t>& out) const {
  bpe_merge_heap(piece, byte_id_, [this](int32_t a, int32_t b, uint32_t& rank, int32_t& merged) {
    const MergeTable::Slot* s = merges_->find(MergeTable::key(a, b));
    if (!s) return false;
    rank = s->rank;
    merged = s->merged;
    return true;
  }, out);
}

// ---- Encoder -----------------------------------------------------------------------
// Word cache: open addressing over (hash, key bytes) → ids, arena-backed; cleared
// wholesale when full so memory stays bounded on any input.
struct Encoder::Cache {
  struct Slot {
    uint64_t hash;
    uint32_t key_off, key_len, ids_off, ids_len;
    bool used;
  };
  static constexpr size_t kSlots = 1 << 17;         // power of two
  static constexpr size_t kMaxEntries = kSlots / 2;  // load factor ≤ 0.5
  static constexpr size_t kMaxKey = 128;             // longer pieces are not cached
  std::vector<Slot> slots = std::vector<Slot>(kSlots, Slot{0, 0, 0, 0, 0, false});
  std::string keys;
  std::vector<int32_t> ids;
  size_t entries = 0;

  void clear() {
    for (auto& s : slots) s.used = false;
    keys.clear();
    ids.clear();
    entries = 0;
  }
  // Returns the slot for (hash, key): used → hit, else the free slot to fill.
  Slot* probe(uint64_t h, std::string_view key) {
    for (size_t i = h & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      Slot& s = slots[i];
      if (!s.used) return &s;
      if (s.hash == h && s.key_len == key.size() && std::memcmp(keys.data() + s.key_off, key.data(), key.size()) == 0)
        return &s;
    }
  }
};

Encoder::Encoder(const Tokenizer& tok) : tok_(tok), cache_(std::make_unique<Cache>()) {
  auto* re = static_cast<pcre2_code*>(tok.regex_);
  match_data_ = pcre2_match_data_create_from_pattern(re, nullptr);
  auto* mctx = pcre2_match_context_create(nullptr);
  // Long whitespace runs recurse in `\s+(?!\S)`; the 32 KiB default JIT stack is too small.
  auto* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MPT_CHECK(match_data_ && mctx && stack, "cannot allocate PCRE2 match state", "out of memory?");
  pcre2_jit_stack_assign(mctx, nullptr, stack);
  match_context_ = mctx;
  jit_stack_ = stack;
}

Encoder::~Encoder() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(match_context_));
  pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
}

void Encoder::encode(std::string_view text, std::vector<int32_t>& out) {
  int64_t bad = find_invalid_utf8(text);
  MPT_CHECK(bad < 0, str("text is not valid UTF-8 (byte offset ", bad, ")"),
            "decode the input as UTF-8 before tokenising");
  auto* re = static_cast<pcre2_code*>(tok_.regex_);
  auto* md = static_cast<pcre2_match_data*>(match_data_);
  auto* mctx = static_cast<pcre2_match_context*>(match_context_);
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  Cache& c = *cache_;
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = pcre2_jit_match(re, subject, text.size(), pos, 0, md, mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // cannot happen: the pattern covers every character
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      MPT_THROW(str("GPT-2 pre-tokeniser failed at byte ", pos, ": ", reinterpret_cast<char*>(msg)), "");
    }
    size_t b = ov[0], e = ov[1];
    pos = e > pos ? e : pos + 1;
    std::string_view piece = text.substr(b, e - b);
    if (piece.size() > Cache::kMaxKey) {
      tok_.bpe(piece, scratch_, out);
      continue;
    }
    uint64_t h = fnv1a(piece.data(), piece.size());
    Cache::Slot* s = c.probe(h, piece);
    if (s->used) {
      out.insert(out.end(), c.ids.begin() + s->ids_off, c.ids.begin() + s->ids_off + s->ids_len);
      continue;
    }
    size_t before = out.size();
    tok_.bpe(piece, scratch_, out);
    if (c.entries >= Cache::kMaxEntries) {
      c.clear();
      s = c.probe(h, piece);
    }
    *s = Cache::Slot{h, static_cast<uint32_t>(c.keys.size()), static_cast<uint32_t>(piece.size()),
                     static_cast<uint32_t>(c.ids.size()), static_cast<uint32_t>(out.size() - before), true};
    c.keys.append(piece);
    c.ids.insert(c.ids.end(), out.begin() + before, out.end());
    ++c.entries;
  }
}

// ---- free functions ----------------------------------------------------------------
int64_t padded_vocab_size(int64_t vocab_size, int tensor_parallel_size, int divisible_by) {
  MPT_CHECK(vocab_size > 0 && tensor_parallel_size > 0 && divisible_by > 0,
            str("padded_vocab_size: bad arguments vocab=", vocab_size, " tp=", tensor_parallel_size,
                " divisible_by=", divisible_by),
            "");
  int64_t multiple = static_cast<int64_t>(divisible_by) * tensor_parallel_size;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

int64_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return static_cast<int64_t>(i);
    if (i + len > n) return static_cast<int64_t>(i);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return static_cast<int64_t>(i);
    i += len;
  }
  return -1;
}

}  // namespace mpitron::data
