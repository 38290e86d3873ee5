// tests/data/test_tokenizer.cpp — GPT-2 BPE against Hugging Face `tokenizers`
// (references written by tests/reference/tokenize_ref.py, cross-checked there
// with tiktoken): every line of tinyshakespeare, WikiText-2 test and LAMBADA
// test, each file as one string, and edge cases.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/timer.h"
#include "data/tokenizer.h"
#include "tests/data/data_test_util.h"

using namespace mpitron;
using namespace mpitron::data;
using namespace mpitron::testing;

namespace {

const Tokenizer& gpt2() {
  static Tokenizer tok(source_path("assets/gpt2/gpt2-vocab.json"), source_path("assets/gpt2/gpt2-merges.txt"));
  return tok;
}

std::vector<int32_t> parse_ids(const std::string& line) {
  std::vector<int32_t> ids;
  std::istringstream is(line);
  int32_t v;
  while (is >> v) ids.push_back(v);
  return ids;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < 40; ++i) s += std::to_string(ids[i]) + " ";
  return s + (ids.size() > 40 ? "..." : "");
}

// Compares every line of `text_file` with tests/data/ref/tokens_<name>.txt.
void check_against_reference(const std::string& name, const std::string& text_file, bool jsonl) {
  std::vector<std::string> lines = split_lines(read_all(source_path("assets/text/" + text_file)));
  std::string whole;
  if (jsonl) {
    for (auto& l : lines) l = nlohmann::json::parse(l).at("text").get<std::string>();
    for (size_t i = 0; i < lines.size(); ++i) whole += (i ? "\n" : "") + lines[i];
  } else {
    whole = read_all(source_path("assets/text/" + text_file));
  }
  std::vector<std::string> ref = split_lines(read_all(source_path("tests/data/ref/tokens_" + name + ".txt")));
  REQUIRE(ref.size() >= 2);
  size_t n = 0, k = 0;
  REQUIRE(std::sscanf(ref[0].c_str(), ("tokens " + name + " lines=%zu full=%zu").c_str(), &n, &k) == 2);
  REQUIRE(n == lines.size());
  REQUIRE(ref.size() == 1 + n + k + 1);

  Encoder enc(gpt2());
  std::vector<int32_t> ids;
  size_t mismatches = 0, tokens = 0;
  for (size_t i = 0; i < n; ++i) {
    ids.clear();
    enc.encode(lines[i], ids);
    tokens += ids.size();
    char buf[64];
    std::snprintf(buf, sizeof buf, "%zu %016llx", ids.size(), static_cast<unsigned long long>(fnv1a_ids(ids)));
    if (ref[1 + i] != buf) {
      if (++mismatches <= 5) {
        std::string expected = i < k ? show(parse_ids(ref[1 + n + i])) : "(count hash) " + ref[1 + i];
        FAIL_CHECK(name << " line " << i + 1 << " differs\n  text: " << lines[i].substr(0, 200)
                        << "\n  ours: " << show(ids) << "\n  ref:  " << expected);
      }
    }
    if (i < k && gpt2().decode(ids) != lines[i]) FAIL_CHECK(name << " line " << i + 1 << ": decode(encode(x)) != x");
  }
  CHECK_MESSAGE(mismatches == 0, name << ": " << mismatches << " of " << n << " lines differ");
  MESSAGE(name << ": " << n << " lines, " << tokens << " tokens, all equal to Hugging Face tokenizers");

  ids = enc.encode(whole);
  char buf[64];
  std::snprintf(buf, sizeof buf, "whole %zu %016llx", ids.size(), static_cast<unsigned long long>(fnv1a_ids(ids)));
  CHECK_MESSAGE(ref.back() == buf, name << " as one string: ours '" << buf << "' ref '" << ref.back() << "'");
  CHECK(gpt2().decode(ids) == whole);
}

}  // namespace

TEST_CASE("tokenizer: vocab, eod, padded vocab size") {
  const Tokenizer& tok = gpt2();
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.eod() == 50256);
  CHECK(padded_vocab_size(50257, 1) == 50304);
  CHECK(padded_vocab_size(50257, 2) == 50432);
  CHECK(padded_vocab_size(50257, 4) == 50688);
  CHECK(padded_vocab_size(50257, 8) == 51200);
  CHECK(padded_vocab_size(50304, 1) == 50304);
  CHECK(tok.encode("Hello world") == std::vector<int32_t>{15496, 995});
  CHECK(tok.decode({15496, 995}) == "Hello world");
  // Megatron treats a literal <|endoftext|> as text, never as the eod id.
  CHECK(tok.encode("<|endoftext|>") == std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29});
  CHECK(tok.decode({50256}) == "<|endoftext|>");
  CHECK_THROWS_AS(tok.decode({50257}), Error);
  CHECK_THROWS_AS(tok.decode({-1}), Error);
}

TEST_CASE("tokenizer: edge cases equal Hugging Face tokenizers") {
  auto cases = nlohmann::json::parse(read_all(source_path("tests/data/ref/edge_cases.json")));
  std::vector<std::string> ref = split_lines(read_all(source_path("tests/data/ref/tokens_edge.txt")));
  REQUIRE(ref.size() == cases.size() + 1);
  Encoder enc(gpt2());
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string text = cases[i].get<std::string>();
    std::vector<int32_t> ids = enc.encode(text);
    CHECK_MESSAGE(ids == parse_ids(ref[1 + i]), "edge case " << i << " " << nlohmann::json(text).dump()
                                                         << "\n  ours: " << show(ids) << "\n  ref:  " << ref[1 + i]);
    CHECK(gpt2().decode(ids) == text);
  }
}

TEST_CASE("tokenizer: every line of tinyshakespeare equals the reference") {
  check_against_reference("tinyshakespeare", "tinyshakespeare.txt", false);
}
TEST_CASE("tokenizer: every line of WikiText-2 test equals the reference") {
  check_against_reference("wikitext2_test", "wikitext-2.test.txt", false);
}
TEST_CASE("tokenizer: every LAMBADA test text equals the reference") {
  check_against_reference("lambada_test", "lambada_test.jsonl", true);
}

TEST_CASE("tokenizer: invalid UTF-8 is a clear error") {
  Encoder enc(gpt2());
  for (std::string bad : {std::string("ab\xff"), std::string("\xc0\xaf"), std::string("x\xed\xa0\x80"),
                          std::string("\xe2\x82"), std::string("\xf4\x90\x80\x80")}) {
    CHECK(find_invalid_utf8(bad) >= 0);
    try {
      enc.encode(bad);
      FAIL("no error for invalid UTF-8");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("UTF-8") != std::string::npos);
    }
  }
  CHECK(find_invalid_utf8("héllo 🤗") == -1);
  CHECK(find_invalid_utf8("ab\xff") == 2);
}

TEST_CASE("tokenizer: missing or mismatched files name the file") {
  try {
    Tokenizer t("/nonexistent/vocab.json", source_path("assets/gpt2/gpt2-merges.txt"));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("/nonexistent/vocab.json") != std::string::npos);
  }
  TempDir dir("tok");
  write_all(dir / "merges.txt", "#version: 0.2\nĠ t\nzz qq\n");
  try {
    Tokenizer t(source_path("assets/gpt2/gpt2-vocab.json"), dir / "merges.txt");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("line 3") != std::string::npos);
  }
}

TEST_CASE("tokenizer: a 1 MB piece without spaces is merged in O(n log n)") {
  // One regex piece of 1 MB of letters: the rescanning BPE would need ~10^12 steps.
  std::string s;
  uint32_t x = 12345;
  for (int i = 0; i < (1 << 20); ++i) {
    x = x * 1103515245u + 12345u;
    s.push_back(static_cast<char>('a' + (x >> 16) % 26));
  }
  Encoder enc(gpt2());
  mpitron::Timer t;
  std::vector<int32_t> ids = enc.encode(s);
  CHECK(t.seconds() < 20.0);
  CHECK(ids.size() > s.size() / 8);
  CHECK(gpt2().decode(ids) == s);
}
