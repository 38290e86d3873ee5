// tests/data/test_llama_tokenizers.cpp — HuggingFaceTokenizer (tokenizer.json byte-level
// BPE) against Hugging Face `tokenizers`, SentencePieceTokenizer / Llama2Tokenizer against
// `sentencepiece` + Megatron's special-token loop, token for token. References and the
// small trained tokenizers come from tests/reference/llama_tokenizers_ref.py: the first
// 4 KB of three bundled texts and edge cases (emoji, CJK, combining marks, whitespace
// runs, special tokens in text, CRLF, empty).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/timer.h"
#include "data/hf_tokenizer.h"
#include "data/sp_tokenizer.h"
#include "data/text_tokenizer.h"
#include "tests/data/data_test_util.h"
#include "tests/error_of.h"  // error_of

using namespace mpitron;
using mpitron::testing_util::error_of;
using namespace mpitron::data;
using namespace mpitron::testing;

namespace {

const nlohmann::json& ref() {
  static nlohmann::json j = nlohmann::json::parse(read_all(source_path("tests/data/ref/llama_tokenizers_ref.json")));
  return j;
}
std::string hf_file() { return source_path("tests/data/ref/llama3_style/tokenizer.json"); }
std::string sp_file() { return source_path("tests/data/ref/sp_bpe.model"); }

void check_all(const char* key, TextEncoder& enc) {
  for (const auto& c : ref()["cases"]) {
    CAPTURE(c["name"].get<std::string>());
    auto want = c[key].get<std::vector<int32_t>>();
    CHECK(enc.encode(c["text"].get<std::string>()) == want);
  }
}

}  // namespace

TEST_CASE("HuggingFaceTokenizer: ids equal HF tokenizers, with and without special tokens") {
  HFTokenizer tok(hf_file());
  CHECK(tok.vocab_size() == ref()["hf_vocab_size"].get<int64_t>());
  CHECK(tok.bos() == tok.token_to_id("<|begin_of_text|>"));
  CHECK(tok.eod() == tok.token_to_id("<|end_of_text|>"));  // tokenizer_config.json eos_token
  CHECK(tok.token_to_id("<|eot_id|>") == 2000);
  auto plain = tok.make_encoder(false);
  check_all("hf", *plain);
  auto special = tok.make_encoder();  // Megatron's tokenize(): add_special_tokens=True
  check_all("hf_special", *special);
}

TEST_CASE("HuggingFaceTokenizer: GPT-NeoX-style ByteLevel pre-tokenizer (GPT-2 regex, add_prefix_space), eos by name") {
  HFTokenizer tok(source_path("tests/data/ref/neox_style/tokenizer.json"));
  CHECK(tok.bos() == -1);                                  // no template, no tokenizer_config.json
  CHECK(tok.eod() == tok.token_to_id("<|end_of_text|>"));  // found among the special added tokens
  check_all("neox", *tok.make_encoder());
}

TEST_CASE("HuggingFaceTokenizer: merges as [left, right] pairs read the same as \"left right\" strings") {
  TempDir dir("hfpairs");
  auto j = nlohmann::json::parse(read_all(hf_file()));
  for (auto& m : j["model"]["merges"]) {
    std::string s = m.get<std::string>();
    m = nlohmann::json::array({s.substr(0, s.find(' ', 1)), s.substr(s.find(' ', 1) + 1)});
  }
  write_all((dir.path / "tokenizer.json").string(), j.dump());
  write_all((dir.path / "tokenizer_config.json").string(), read_all(source_path("tests/data/ref/llama3_style/tokenizer_config.json")));
  HFTokenizer tok((dir.path / "tokenizer.json").string());
  check_all("hf_special", *tok.make_encoder());
}

TEST_CASE("whole bundled files: id count and FNV-1a equal the references") {
  HFTokenizer hf(hf_file()), neox(source_path("tests/data/ref/neox_style/tokenizer.json"));
  SPTokenizer sp(sp_file(), SPTokenizer::Mode::kSentencePiece);
  auto hf_enc = hf.make_encoder(false), neox_enc = neox.make_encoder(false);
  for (const auto& f : ref()["files"]) {
    const std::string text = read_all(source_path(f["path"].get<std::string>()));
    CAPTURE(f["path"].get<std::string>());
    std::vector<int32_t> sp_ids;
    Timer t;
    auto hf_ids = hf_enc->encode(text);
    const double hf_s = t.seconds();
    auto neox_ids = neox_enc->encode(text);
    Timer t2;
    sp.encode_plain(text, sp_ids);
    const double sp_s = t2.seconds();
    MESSAGE(f["path"].get<std::string>(), ": HF ", text.size() / hf_s / 1e6, " MB/s, SentencePiece ", text.size() / sp_s / 1e6, " MB/s");
    for (auto [key, ids] : {std::pair<const char*, std::vector<int32_t>*>{"hf", &hf_ids}, {"neox", &neox_ids}, {"sp", &sp_ids}}) {
      CAPTURE(key);
      CHECK(static_cast<int64_t>(ids->size()) == f[key]["count"].get<int64_t>());
      CHECK(std::to_string(fnv1a_ids(*ids)) == f[key]["fnv1a"].get<std::string>());
    }
  }
}

TEST_CASE("HuggingFaceTokenizer: decode gives back the text") {
  HFTokenizer tok(hf_file());
  auto enc = tok.make_encoder(false);
  for (const auto& c : ref()["cases"]) {
    std::string text = c["text"].get<std::string>();
    CHECK(tok.decode(enc->encode(text)) == text);
  }
}

TEST_CASE("SentencePieceTokenizer / Llama2Tokenizer / GPTSentencePieceTokenizer: ids equal sentencepiece and Megatron's semantics") {
  SPTokenizer sp(sp_file(), SPTokenizer::Mode::kSentencePiece), llama(sp_file(), SPTokenizer::Mode::kLlama2),
      gpt(sp_file(), SPTokenizer::Mode::kGPT);
  CHECK(sp.vocab_size() == ref()["sp_megatron_vocab_size"].get<int64_t>());
  CHECK(sp.eod() == ref()["sp_megatron_eod"].get<int32_t>());
  CHECK(llama.vocab_size() == ref()["sp_vocab_size"].get<int64_t>());
  CHECK(llama.eod() == 2);
  CHECK(llama.bos() == 1);
  std::vector<int32_t> out;
  for (const auto& c : ref()["cases"]) {
    CAPTURE(c["name"].get<std::string>());
    out.clear();
    sp.encode_plain(c["text"].get<std::string>(), out);
    CHECK(out == c["sp"].get<std::vector<int32_t>>());
  }
  check_all("sp_megatron", *sp.make_encoder());
  check_all("sp_llama2", *llama.make_encoder());
  check_all("sp", *gpt.make_encoder());  // GPTSentencePieceTokenizer: plain sp.encode
  CHECK(gpt.eod() == 2);
  CHECK(gpt.vocab_size() == ref()["sp_vocab_size"].get<int64_t>());
  auto ids = sp.encode("a<EOD>b");
  CHECK(sp.decode(ids) == "a<EOD>b");
}

TEST_CASE("make_tokenizer picks by --tokenizer-type and names the flag it needs") {
  CHECK(make_tokenizer({"HuggingFaceTokenizer", hf_file(), "", ""})->type() == "HuggingFaceTokenizer");
  CHECK(make_tokenizer({"SentencePieceTokenizer", sp_file(), "", ""})->eod() == ref()["sp_megatron_eod"].get<int32_t>());
  auto gpt2 = make_tokenizer({"GPT2BPETokenizer", "", "", ""});
  CHECK(gpt2->vocab_size() == 50257);
  CHECK(gpt2->eod() == 50256);
  CHECK(gpt2->encode("Hello world") == std::vector<int32_t>{15496, 995});
  CHECK(error_of([] { make_tokenizer({"BertWordPieceLowerCase", "", "", ""}); }).find("BertWordPieceLowerCase") != std::string::npos);
  CHECK(error_of([] { make_tokenizer({"HuggingFaceTokenizer", "", "", ""}); }).find("--tokenizer-model") != std::string::npos);
  CHECK(error_of([] { make_tokenizer({"SentencePieceTokenizer", hf_file(), "", ""}); }).find(hf_file()) != std::string::npos);
}

TEST_CASE("HuggingFaceTokenizer: an unusable tokenizer.json is named with its unsupported part") {
  TempDir dir("hftok");
  auto j = nlohmann::json::parse(read_all(hf_file()));
  auto bad = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& part) {
    nlohmann::json k = j;
    edit(k);
    std::string path = (dir.path / "tokenizer.json").string();
    write_all(path, k.dump());
    std::string e = error_of([&] { HFTokenizer t(path); });
    CAPTURE(e);
    CHECK(e.find(path) != std::string::npos);
    CHECK(e.find(part) != std::string::npos);
  };
  bad([](auto& k) { k["model"]["type"] = "WordPiece"; }, "model.type");
  bad([](auto& k) { k["model"]["type"] = "Unigram"; }, "Unigram");
  bad([](auto& k) { k["model"]["byte_fallback"] = true; }, "byte_fallback");
  bad([](auto& k) { k["normalizer"] = {{"type", "NFKC"}}; }, "normalizer NFKC");
  bad([](auto& k) { k["normalizer"] = {{"type", "NFC"}}; }, "normalizer NFC");
  bad([](auto& k) { k["pre_tokenizer"] = {{"type", "Metaspace"}}; }, "pre_tokenizer \"Metaspace\"");
  bad([](auto& k) { k["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithPrevious"; }, "MergedWithPrevious");
  bad([](auto& k) { k["decoder"] = {{"type", "WordPiece"}}; }, "decoder");
  bad([](auto& k) { k["post_processor"] = {{"type", "BertProcessing"}}; }, "BertProcessing");
  bad([](auto& k) { k["added_tokens"][0]["lstrip"] = true; }, "lstrip");
  bad([](auto& k) { k["model"]["merges"][0] = "zz"; }, "merge 0");
  bad([](auto& k) { k["model"]["vocab"] = {{"a", 3}}; }, "byte");  // (id 0 is <|begin_of_text|>'s: two tokens on one id)
  bad([](auto& k) { k["model"]["vocab"] = {{"a", 0}}; }, "which '<|begin_of_text|>' already has");
  std::string path = (dir.path / "tokenizer.json").string();
  write_all(path, "{not json");
  CHECK(error_of([&] { HFTokenizer t(path); }).find(path) != std::string::npos);
  CHECK(error_of([&] { HFTokenizer t((dir.path / "missing.json").string()); }).find("missing.json") != std::string::npos);
}
