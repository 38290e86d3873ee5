// data/hf_tokenizer.cpp — tokenizer.json byte-level BPE: added-token cut, Split /
// ByteLevel pre-tokenisers (PCRE2, UTF + UCP), heap BPE, TemplateProcessing.
#include "data/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "core/error.h"
#include "core/json.h"
#include "data/bpe_heap.h"
#include "data/tokenizer.h"

namespace mpitron::data {

namespace {

using json = nlohmann::json;

// GPT-2 pre-tokenisation pattern (HF ByteLevel with use_regex).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2 bytes_to_unicode inverse: code point → byte, -1 when not a byte-level char.
std::vector<int> unicode_to_byte_table() {
  std::vector<int> table(512, -1);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table[printable ? b : 256 + n++] = b;
  }
  return table;
}

bool byte_level_to_bytes(const std::string& s, const std::vector<int>& u2b, std::string& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    uint32_t cp;
    if (c < 0x80) {
      cp = c, i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F), i += 2;
    } else {
      return false;
    }
    if (cp >= u2b.size() || u2b[cp] < 0) return false;
    out.push_back(static_cast<char>(u2b[cp]));
  }
  return true;
}

size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4; }

std::string dir_of(const std::string& path) {
  size_t s = path.rfind('/');
  return s == std::string::npos ? "." : path.substr(0, s);
}

}  // namespace

struct HFTokenizer::Impl {
  struct Step {
    pcre2_code* re = nullptr;  // Split (Isolated) or ByteLevel's GPT-2 regex; null: no split
    bool prefix_space = false;  // ByteLevel add_prefix_space
  };
  struct Added {
    std::string content;
    int32_t id;
  };
  std::vector<Step> steps;
  std::vector<std::vector<Added>> added_by_byte = std::vector<std::vector<Added>>(256);  // longest first
  std::unordered_map<std::string, int32_t> bytes_to_id;
  std::unordered_map<std::string, int32_t> added_to_id;
  std::unordered_map<uint64_t, std::pair<uint32_t, int32_t>> merges;  // (l,r) → (rank, merged)
  int32_t byte_id[256];
  bool ignore_merges = false;
  std::vector<int32_t> prefix, suffix;  // TemplateProcessing single: prefix $A suffix

  ~Impl() {
    for (auto& s : steps)
      if (s.re) pcre2_code_free(s.re);
  }
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // Heap BPE (HF's word merge): lowest rank first, ties left to right.
  void bpe(std::string_view piece, std::vector<int32_t>& out) const {
    if (ignore_merges) {
      auto it = bytes_to_id.find(std::string(piece));
      if (it != bytes_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    }
    bpe_merge_heap(piece, byte_id, [this](int32_t a, int32_t b, uint32_t& rank, int32_t& merged) {
      auto it = merges.find(key(a, b));
      if (it == merges.end()) return false;
      rank = it->second.first;
      merged = it->second.second;
      return true;
    }, out);
  }
};

namespace {

pcre2_code* compile(const std::string& pattern, const std::string& file) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    MPT_THROW(str("tokenizer '", file, "': pre_tokenizer Split regex '", pattern, "' does not compile in PCRE2 at offset ",
                  off, ": ", reinterpret_cast<char*>(msg)),
              "this Oniguruma pattern is not supported");
  }
  // A pattern that can match the empty string splits differently in every
  // regex engine (tokenizers' Oniguruma find_iter has its own rules for empty
  // matches): refuse it rather than tokenise otherwise than tokenizers.
  uint32_t min_len = 1;
  pcre2_pattern_info(re, PCRE2_INFO_MINLENGTH, &min_len);
  if (min_len == 0) {
    pcre2_code_free(re);
    MPT_THROW(str("tokenizer '", file, "': pre_tokenizer Split regex '", pattern, "' can match the empty string"),
              "a pre-tokeniser pattern must consume at least one character per match (e.g. use + instead of *)");
  }
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is absent
  return re;
}

[[noreturn]] void unsupported(const std::string& file, const std::string& key, const std::string& value) {
  MPT_THROW(str("tokenizer '", file, "': unsupported ", key, " ", value),
            "HuggingFaceTokenizer reads byte-level BPE tokenizer.json files (Llama 3, GPT-NeoX style)");
}

// A token id as tokenizers reads it (a JSON integer that fits u32; 3.5 and 3.0
// are refused as tokenizers refuses them), below `limit`: ids size the
// embedding table, so an id far past the number of tokens (10^9, 2^31) is a
// damaged file, not a request for a billion unused rows.
int32_t read_id(const json& v, const std::string& file, const std::string& field, int64_t limit) {
  MPT_CHECK(v.is_number_integer(), str("tokenizer '", file, "': ", field, " = ", json_excerpt(v), " is not an integer id"),
            "token ids are non-negative integers");
  const bool neg = v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0;
  const uint64_t id = neg ? 0 : v.get<uint64_t>();
  MPT_CHECK(!neg && id < static_cast<uint64_t>(limit),
            str("tokenizer '", file, "': ", field, " = ", json_excerpt(v), " is not an id in [0, ", limit, ")"),
            "ids run below twice the number of tokens plus 1024 (at least 65536): a larger one is a damaged file, "
            "not a request for that many embedding rows");
  return static_cast<int32_t>(id);
}

bool is_null_or(const json& j, const char* key, const json& ok) {
  return !j.contains(key) || j[key].is_null() || j[key] == ok;
}

}  // namespace

HFTokenizer::HFTokenizer(const std::string& path) : impl_(std::make_unique<Impl>()), file_(path) {
  try {
    load(path);
  } catch (const json::exception& e) {  // a value of the wrong JSON type somewhere
    MPT_THROW(str("tokenizer '", path, "': ", e.what()), "pass a Hugging Face tokenizer.json");
  }
}

void HFTokenizer::load(const std::string& path) {
  const json j = read_json_file(path, "tokenizer");
  MPT_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
            str("tokenizer '", path, "' has no \"model\" object"), "pass a Hugging Face tokenizer.json");
  Impl& m = *impl_;
  const std::vector<int> u2b = unicode_to_byte_table();

  // ---- model ----
  const json& model = j["model"];
  std::string mtype = model.value("type", std::string("BPE"));
  if (mtype != "BPE") unsupported(path, "model.type", "\"" + mtype + "\" (only BPE)");
  if (!is_null_or(model, "dropout", json(0.0)) && !(model["dropout"].is_number() && model["dropout"] == 0))
    unsupported(path, "model.dropout", json_excerpt(model["dropout"]));
  if (model.value("byte_fallback", false)) unsupported(path, "model.byte_fallback", "true");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!is_null_or(model, k, json(""))) unsupported(path, str("model.", k), json_excerpt(model[k]));
  m.ignore_merges = model.value("ignore_merges", false);
  MPT_CHECK(model.contains("vocab") && model["vocab"].is_object(), str("tokenizer '", path, "': model.vocab is not an object"), "");
  const json& vocab = model["vocab"];
  const json no_added = json::array();
  const json& added_json = j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"] : no_added;
  const int64_t id_limit = std::max<int64_t>(2 * static_cast<int64_t>(vocab.size() + added_json.size()) + 1024, 65536);

  // Added tokens first: their content need not be byte-level characters.
  std::vector<std::pair<std::string, int32_t>> added;
  for (const json& a : added_json) {
    std::string content = a.at("content").get<std::string>();
    for (const char* k : {"lstrip", "rstrip", "single_word"})
      if (a.value(k, false)) unsupported(path, str("added_tokens[\"", content, "\"].", k), "true");
    MPT_CHECK(!content.empty(), str("tokenizer '", path, "': an added token is empty"), "");
    added.emplace_back(content, read_id(a.at("id"), path, str("added_tokens[\"", content, "\"].id"), id_limit));
  }
  // One token per id and one id per token. tokenizers reads a file that breaks
  // this otherwise than it says (an added token that is also in model.vocab
  // gets the vocab's id; two tokens on one id decode to either), so such a
  // file is refused, naming both.
  std::unordered_map<int32_t, std::string> owner;  // id -> token (vocab key or added content)
  const auto claim = [&](int32_t id, const std::string& token, const std::string& where) {
    auto [it, fresh] = owner.emplace(id, token);
    MPT_CHECK(fresh || it->second == token,
              str("tokenizer '", path, "': ", where, " gives id ", id, " to '", token, "', which '", it->second,
                  "' already has"),
              "every id names one token: fix the file (it is not one `tokenizers` reads as written)");
  };
  int64_t max_id = -1;
  for (auto& [content, id] : added) {
    auto dup = m.added_to_id.find(content);
    MPT_CHECK(dup == m.added_to_id.end() || dup->second == id,
              str("tokenizer '", path, "': added token '", content, "' is listed with ids ", dup == m.added_to_id.end() ? 0 : dup->second,
                  " and ", id), "list each added token once");
    claim(id, content, "added_tokens");
    m.added_to_id[content] = id;
    max_id = std::max<int64_t>(max_id, id);
  }
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = read_id(it.value(), path, str("model.vocab[\"", it.key(), "\"]"), id_limit);
    auto ad = m.added_to_id.find(it.key());
    MPT_CHECK(ad == m.added_to_id.end() || ad->second == id,
              str("tokenizer '", path, "': added token '", it.key(), "' has id ", ad == m.added_to_id.end() ? 0 : ad->second,
                  " but model.vocab gives it id ", id),
              "`tokenizers` would use the vocab's id for it: give both the same id");
    claim(id, it.key(), "model.vocab");
    max_id = std::max<int64_t>(max_id, id);
  }
  id_to_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  std::string raw;
  for (auto& a : added) id_to_bytes_[a.second] = a.first;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = it.value().get<int32_t>();
    if (!byte_level_to_bytes(it.key(), u2b, raw)) {
      if (m.added_to_id.count(it.key())) continue;
      unsupported(path, str("model.vocab token '", it.key(), "'"),
                  "(not made of byte-level characters: the file is not a byte-level BPE; is its pre_tokenizer "
                  "Metaspace / decoder not ByteLevel?)");
    }
    if (!m.added_to_id.count(it.key())) id_to_bytes_[id] = raw;
    m.bytes_to_id.emplace(raw, id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = m.bytes_to_id.find(std::string(1, static_cast<char>(b)));
    MPT_CHECK(it != m.bytes_to_id.end(), str("tokenizer '", path, "': model.vocab lacks the byte-level token of byte ", b),
              "byte-level BPE vocabularies hold all 256 bytes");
    m.byte_id[b] = it->second;
  }
  MPT_CHECK(model.contains("merges") && model["merges"].is_array(), str("tokenizer '", path, "': model.merges is not a list"), "");
  uint32_t rank = 0;
  std::string a, b, l, r;
  for (const json& mg : model["merges"]) {
    if (mg.is_string()) {
      const std::string& s = mg.get_ref<const std::string&>();
      size_t sp = s.find(' ', 1);
      MPT_CHECK(sp != std::string::npos, str("tokenizer '", path, "': merge ", rank, " '", s, "' is not 'left right'"), "");
      l = s.substr(0, sp), r = s.substr(sp + 1);
    } else {
      MPT_CHECK(mg.is_array() && mg.size() == 2, str("tokenizer '", path, "': merge ", rank, " is not a pair"), "");
      l = mg[0].get<std::string>(), r = mg[1].get<std::string>();
    }
    bool ok = byte_level_to_bytes(l, u2b, a) && byte_level_to_bytes(r, u2b, b);
    auto ia = m.bytes_to_id.find(a), ib = m.bytes_to_id.find(b), im = m.bytes_to_id.find(a + b);
    MPT_CHECK(ok && ia != m.bytes_to_id.end() && ib != m.bytes_to_id.end() && im != m.bytes_to_id.end(),
              str("tokenizer '", path, "': merge ", rank, " '", l, " ", r, "' uses or makes a token missing from model.vocab"), "");
    // A pair listed twice takes its LAST rank, as tokenizers' merge map (a
    // HashMap collected in list order) does.
    m.merges.insert_or_assign(Impl::key(ia->second, ib->second), std::make_pair(rank, im->second));
    ++rank;
  }
  for (auto& [content, id] : added) m.added_by_byte[static_cast<unsigned char>(content[0])].push_back({content, id});
  for (auto& v : m.added_by_byte)
    std::stable_sort(v.begin(), v.end(), [](const Impl::Added& x, const Impl::Added& y) { return x.content.size() > y.content.size(); });

  // ---- normalizer ----
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    unsupported(path, "normalizer", j["normalizer"].value("type", json_excerpt(j["normalizer"])) +
                                        " (only null: no Unicode normalisation is built)");

  // ---- pre_tokenizer ----
  std::function<void(const json&)> pre = [&](const json& p) {
    std::string t = p.value("type", "");
    if (t == "Sequence") {
      for (const json& q : p.at("pretokenizers")) pre(q);
    } else if (t == "ByteLevel") {
      Impl::Step s;
      s.prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) s.re = compile(kGpt2Pattern, path);
      m.steps.push_back(s);
    } else if (t == "Split") {
      std::string beh = p.value("behavior", "");
      if (beh != "Isolated") unsupported(path, "pre_tokenizer Split behavior", "\"" + beh + "\" (only Isolated)");
      const json& pat = p.at("pattern");
      if (!pat.contains("Regex")) unsupported(path, "pre_tokenizer Split pattern", json_excerpt(pat) + " (only Regex)");
      m.steps.push_back(Impl::Step{compile(pat["Regex"].get<std::string>(), path), false});
    } else {
      unsupported(path, "pre_tokenizer", "\"" + t + "\" (only ByteLevel, Split and Sequence)");
    }
  };
  MPT_CHECK(j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null(), str("tokenizer '", path, "': pre_tokenizer is null"),
            "HuggingFaceTokenizer needs a ByteLevel pre_tokenizer");
  pre(j["pre_tokenizer"]);

  // ---- decoder ----
  if (j.contains("decoder") && !j["decoder"].is_null() && j["decoder"].value("type", "") != "ByteLevel")
    unsupported(path, "decoder", "\"" + j["decoder"].value("type", "") + "\" (only ByteLevel)");

  // ---- post_processor ----
  std::function<void(const json&)> post = [&](const json& p) {
    if (p.is_null()) return;
    std::string t = p.value("type", "");
    if (t == "Sequence") {
      for (const json& q : p.at("processors")) post(q);
    } else if (t == "TemplateProcessing") {
      bool seen_a = false;
      for (const json& item : p.at("single")) {
        if (item.contains("Sequence")) {
          seen_a = true;
        } else {
          std::string name = item.at("SpecialToken").at("id").get<std::string>();
          for (const json& id : p.at("special_tokens").at(name).at("ids")) {
            const int32_t v = read_id(id, path, str("post_processor special_tokens[\"", name, "\"].ids"),
                                      static_cast<int64_t>(id_to_bytes_.size()));
            (seen_a ? m.suffix : m.prefix).push_back(v);
          }
        }
      }
    } else if (t != "ByteLevel") {
      unsupported(path, "post_processor", "\"" + t + "\" (only TemplateProcessing, ByteLevel and Sequence)");
    }
  };
  if (j.contains("post_processor")) post(j["post_processor"]);

  // ---- bos / eos: tokenizer_config.json beside the file, as AutoTokenizer reads them ----
  const std::string config_path = dir_of(path) + "/tokenizer_config.json";
  auto named = [&](const json& v, const char* key) -> int32_t {
    MPT_CHECK(v.is_null() || v.is_string() || (v.is_object() && v.contains("content") && v["content"].is_string()),
              str("'", config_path, "': ", key, " = ", json_excerpt(v), " is neither a token nor {\"content\": token}"),
              "fix the file (AutoTokenizer reads it too)");
    std::string s = v.is_object() ? v["content"].get<std::string>() : v.is_string() ? v.get<std::string>() : "";
    int32_t id = token_to_id(s);
    MPT_CHECK(s.empty() || id >= 0, str("'", config_path, "' names ", key, " '", s, "', not in the vocab of '", path, "'"), "");
    return id;
  };
  // Read as AutoTokenizer reads it: a file that is there but not a JSON object is an error, not absent.
  if (std::filesystem::exists(config_path)) {
    const json c = read_json_file(config_path, "tokenizer config");
    MPT_CHECK(c.is_object(), str("tokenizer config '", config_path, "' is not a JSON object"), "fix or remove the file");
    if (c.contains("bos_token")) bos_ = named(c["bos_token"], "bos_token");
    if (c.contains("eos_token")) eos_ = named(c["eos_token"], "eos_token");
  }
  if (bos_ < 0 && !m.prefix.empty()) bos_ = m.prefix.front();
  for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<|im_end|>", "<eos>"})
    if (eos_ < 0 && m.added_to_id.count(name)) eos_ = m.added_to_id[name];
}

HFTokenizer::~HFTokenizer() = default;

int32_t HFTokenizer::eod() const {
  MPT_CHECK(eos_ >= 0, str("tokenizer '", file_, "' has no end-of-document token"),
            "put a tokenizer_config.json with \"eos_token\" beside it");
  return eos_;
}

int32_t HFTokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->added_to_id.find(std::string(token));
  if (it != impl_->added_to_id.end()) return it->second;
  auto jt = impl_->bytes_to_id.find(std::string(token));
  return jt == impl_->bytes_to_id.end() ? -1 : jt->second;
}

std::string HFTokenizer::decode(const int32_t* ids, size_t n) const {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    MPT_CHECK(ids[i] >= 0 && ids[i] < vocab_size(),
              str("token id ", ids[i], " is outside the vocabulary [0, ", vocab_size(), ") of '", file_, "'"),
              "the ids come from a different tokenizer or a corrupt file");
    out += id_to_bytes_[ids[i]];
  }
  return out;
}

// ---- encoder -------------------------------------------------------------------------
class HFEncoder : public TextEncoder {
 public:
  HFEncoder(const HFTokenizer& tok, bool add_special) : m_(*tok.impl_), add_special_(add_special) {
    for (auto& s : m_.steps) md_.push_back(s.re ? pcre2_match_data_create_from_pattern(s.re, nullptr) : nullptr);
    mctx_ = pcre2_match_context_create(nullptr);
    stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    MPT_CHECK(mctx_ && stack_, "cannot allocate PCRE2 match state", "out of memory?");
    pcre2_jit_stack_assign(mctx_, nullptr, stack_);
  }
  ~HFEncoder() override {
    for (auto* d : md_) pcre2_match_data_free(d);
    pcre2_match_context_free(mctx_);
    pcre2_jit_stack_free(stack_);
  }
  using TextEncoder::encode;
  void encode(std::string_view text, std::vector<int32_t>& out) override {
    int64_t bad = find_invalid_utf8(text);
    MPT_CHECK(bad < 0, str("text is not valid UTF-8 (byte offset ", bad, ")"), "decode the input as UTF-8 before tokenising");
    if (add_special_) out.insert(out.end(), m_.prefix.begin(), m_.prefix.end());
    size_t seg = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      const auto& cands = m_.added_by_byte[static_cast<unsigned char>(text[i])];
      for (const auto& a : cands) {
        if (text.compare(i, a.content.size(), a.content) == 0) {
          segment(text.substr(seg, i - seg), out);
          out.push_back(a.id);
          i += a.content.size();
          seg = i;
          --i;
          break;
        }
      }
    }
    segment(text.substr(seg), out);
    if (add_special_) out.insert(out.end(), m_.suffix.begin(), m_.suffix.end());
  }

 private:
  // Pre-tokenise one segment between added tokens, then BPE each piece.
  void segment(std::string_view s, std::vector<int32_t>& out) {
    if (s.empty()) return;
    std::vector<std::string> pieces{std::string(s)}, next;
    for (size_t k = 0; k < m_.steps.size(); ++k) {
      const auto& step = m_.steps[k];
      if (step.prefix_space)
        for (auto& p : pieces)
          if (p[0] != ' ') p.insert(p.begin(), ' ');
      if (!step.re) continue;
      next.clear();
      for (const auto& p : pieces) split(step.re, md_[k], p, next);
      pieces.swap(next);
    }
    for (const auto& p : pieces) m_.bpe(p, out);
  }
  // Split Isolated: every match and every gap between matches is a piece.
  void split(pcre2_code* re, pcre2_match_data* md, const std::string& s, std::vector<std::string>& out) {
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t pos = 0, gap = 0;
    while (pos < s.size()) {
      int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, PCRE2_NO_UTF_CHECK, md, mctx_);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      MPT_CHECK(rc >= 0, str("pre-tokeniser regex failed (PCRE2 error ", rc, ")"), "");
      size_t b = ov[0], e = ov[1];
      if (e == b) {  // empty match: step one character
        pos = b + utf8_len(static_cast<unsigned char>(s[b]));
        continue;
      }
      if (b > gap) out.emplace_back(s.substr(gap, b - gap));
      out.emplace_back(s.substr(b, e - b));
      pos = gap = e;
    }
    if (gap < s.size()) out.emplace_back(s.substr(gap));
  }

  const HFTokenizer::Impl& m_;
  bool add_special_;
  std::vector<pcre2_match_data*> md_;
  pcre2_match_context* mctx_ = nullptr;
  pcre2_jit_stack* stack_ = nullptr;
};

std::unique_ptr<TextEncoder> HFTokenizer::make_encoder(bool add_special) const {
  return std::make_unique<HFEncoder>(*this, add_special);
}

}  // namespace mpitron::data
