// tests/data/test_wordpiece_tokenizer.cpp — BertWordPieceLowerCase / BertWordPieceCase
// against Hugging Face `BertWordPieceTokenizer(vocab.txt).encode(text,
// add_special_tokens=False)`, token for token. The two small vocabs (2000 WordPieces,
// trained by HF on the bundled texts) and the reference ids come from
// tests/reference/bert_tokenizer_ref.py: the first 4 KB of three bundled texts, whole
// files (count + FNV-1a), and edge cases (emoji, CJK, combining marks, accents and case,
// whitespace and control characters, punctuation, over-long words, special tokens in text).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/timer.h"
#include "data/text_tokenizer.h"
#include "data/wordpiece_tokenizer.h"
#include "tests/data/data_test_util.h"
#include "tests/error_of.h"  // error_of

using namespace mpitron;
using mpitron::testing_util::error_of;
using namespace mpitron::data;
using namespace mpitron::testing;

namespace {

const nlohmann::json& ref() {
  static nlohmann::json j = nlohmann::json::parse(read_all(source_path("tests/data/ref/bert_tokenizer_ref.json")));
  return j;
}
std::string vocab(bool lower) {
  return source_path(lower ? "tests/data/ref/bert_uncased/vocab.txt" : "tests/data/ref/bert_cased/vocab.txt");
}

}  // namespace

TEST_CASE("WordPiece: ids equal HF BertWordPieceTokenizer on texts and edge cases, lower-case and cased") {
  for (bool lower : {true, false}) {
    const std::string key = lower ? "uncased" : "cased";
    CAPTURE(key);
    WordPieceTokenizer tok(vocab(lower), lower);
    CHECK(tok.type() == (lower ? "BertWordPieceLowerCase" : "BertWordPieceCase"));
    // vocab.txt's tokens, then Megatron's added [BOS] [EOS].
    CHECK(tok.vocab_size() == ref()[str(key, "_vocab_size")].get<int64_t>() + 2);
    CHECK(tok.bos() == tok.vocab_size() - 2);
    CHECK(tok.eod() == tok.vocab_size() - 1);
    CHECK(tok.pad() == 0);
    CHECK(tok.unk() == 1);
    CHECK(tok.cls() == 2);
    CHECK(tok.sep() == 3);
    CHECK(tok.mask() == 4);
    auto enc = tok.make_encoder();
    int checked = 0;
    for (const auto& c : ref()["cases"]) {
      CAPTURE(c["name"].get<std::string>());
      const auto ids = enc->encode(c["text"].get<std::string>());
      CHECK(ids == c[key].get<std::vector<int32_t>>());
      std::vector<int32_t> uncached;  // without the encoder's word cache
      tok.encode_to(c["text"].get<std::string>(), uncached);
      CHECK(uncached == ids);
      std::vector<std::string> toks;
      for (int32_t id : ids) toks.push_back(tok.id_to_token(id));
      CHECK(toks == c[str(key, "_tokens")].get<std::vector<std::string>>());
      ++checked;
    }
    CHECK(checked >= 20);
  }
}

TEST_CASE("WordPiece: whole bundled files, id count and FNV-1a equal the references") {
  for (bool lower : {true, false}) {
    const std::string key = lower ? "uncased" : "cased";
    WordPieceTokenizer tok(vocab(lower), lower);
    auto enc = tok.make_encoder();
    for (const auto& f : ref()["files"]) {
      const std::string text = read_all(source_path(f["path"].get<std::string>()));
      CAPTURE(key);
      CAPTURE(f["path"].get<std::string>());
      Timer t;
      auto ids = enc->encode(text);
      MESSAGE(key, " ", f["path"].get<std::string>(), ": ", text.size() / t.seconds() / 1e6, " MB/s");
      CHECK(static_cast<int64_t>(ids.size()) == f[key]["count"].get<int64_t>());
      CHECK(std::to_string(fnv1a_ids(ids)) == f[key]["fnv1a"].get<std::string>());
    }
  }
}

TEST_CASE("WordPiece: the factory builds both types from --vocab-file and rejects the wrong files") {
  auto lower = make_tokenizer({"BertWordPieceLowerCase", "", vocab(true), ""});
  CHECK(lower->type() == "BertWordPieceLowerCase");
  CHECK(lower->encode("Hello [MASK]") == WordPieceTokenizer(vocab(true), true).encode("Hello [MASK]"));
  CHECK(lower->mask() == 4);
  CHECK(lower->sep() == 3);
  CHECK(make_tokenizer({"BertWordPieceCase", "", vocab(false), ""})->type() == "BertWordPieceCase");
  CHECK(error_of([] { make_tokenizer({"BertWordPieceCase", "", "", ""}); }).find("--vocab-file") != std::string::npos);
  CHECK(error_of([] { make_tokenizer({"BertWordPieceCase", "x.model", vocab(false), ""}); }).find("--tokenizer-model") !=
        std::string::npos);
  // GPT-2 and the others have no BERT ids.
  CHECK(make_tokenizer({"GPT2BPETokenizer", "", "", ""})->mask() == -1);
}

TEST_CASE("WordPiece: decode glues ## pieces; special ids read back by name") {
  WordPieceTokenizer tok(vocab(true), true);
  auto ids = tok.encode("The quick brown fox [SEP] jumped");
  CHECK(tok.decode(ids) == "the quick brown fox [SEP] jumped");
  CHECK(tok.token_to_id("[CLS]") == tok.cls());
  CHECK(tok.token_to_id("[EOS]") == tok.eod());
  CHECK(tok.token_to_id("no-such-token") == -1);
  CHECK(tok.is_continuation(tok.token_to_id("##s")));
  CHECK_FALSE(tok.is_continuation(tok.cls()));
  CHECK(error_of([&] { tok.decode(std::vector<int32_t>{static_cast<int32_t>(tok.vocab_size())}); }).find("outside") !=
        std::string::npos);
}

TEST_CASE("WordPiece: a bad vocab.txt is named with what is wrong") {
  TempDir dir("wpvocab");
  const std::string path = (dir.path / "vocab.txt").string();
  auto err = [&](const std::string& content) {
    write_all(path, content);
    return error_of([&] { WordPieceTokenizer t(path, true); });
  };
  const std::string ok = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n##b\n";
  CHECK(err(ok).empty());
  CHECK(WordPieceTokenizer(path, true).encode("ab a") == std::vector<int32_t>{5, 6, 5});
  CHECK(WordPieceTokenizer(path, true).encode("abc") == std::vector<int32_t>{1});  // uncovered word → [UNK]
  // A vocab that already has [BOS] / [EOS] keeps their ids (Megatron's add_token).
  write_all(path, ok + "[EOS]\n[BOS]\n");
  CHECK(WordPieceTokenizer(path, true).eod() == 7);
  CHECK(WordPieceTokenizer(path, true).bos() == 8);
  CHECK(WordPieceTokenizer(path, true).vocab_size() == 9);
  // CRLF line ends read the same.
  write_all(path, "[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\n[MASK]\r\na\r\n");
  CHECK(WordPieceTokenizer(path, true).encode("a") == std::vector<int32_t>{5});

  std::string e = err("");
  CHECK(e.find(path) != std::string::npos);
  CHECK(e.find("empty") != std::string::npos);
  e = err("[PAD]\n[CLS]\n[SEP]\na\n");
  CHECK(e.find(path) != std::string::npos);
  CHECK(e.find("[UNK] [MASK]") != std::string::npos);
  e = err(ok + "a\n");
  CHECK(e.find(path + ":8") != std::string::npos);
  CHECK(e.find("'a' is already on line 6") != std::string::npos);
  e = err("[PAD]\n\n[UNK]\n");
  CHECK(e.find(path + ":2") != std::string::npos);
  CHECK(e.find("empty line") != std::string::npos);
  e = error_of([&] { WordPieceTokenizer t((dir.path / "missing.txt").string(), true); });
  CHECK(e.find("missing.txt") != std::string::npos);
}

TEST_CASE("WordPiece: words longer than 100 characters are [UNK]; invalid UTF-8 bytes are dropped") {
  WordPieceTokenizer tok(vocab(true), true);
  CHECK(tok.encode(std::string(101, 'e')) == std::vector<int32_t>{tok.unk()});
  CHECK(tok.encode(std::string(100, 'e')) != std::vector<int32_t>{tok.unk()});
  // ṩ (U+1E69) is s + two marks after NFD: the NFD buffer grows; marks are stripped.
  std::string dotted;
  for (int i = 0; i < 100; ++i) dotted += "\xe1\xb9\xa9";
  CHECK(tok.encode(dotted) == tok.encode(std::string(100, 's')));
  CHECK(tok.encode(dotted + "s") == std::vector<int32_t>{tok.unk()});
  CHECK(tok.encode("the\xff\xfe") == tok.encode("the"));
  CHECK(tok.encode("\xe6\x97") == std::vector<int32_t>{});  // truncated sequence
}
