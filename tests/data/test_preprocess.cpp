// tests/data/test_preprocess.cpp — the preprocess_data and merge_datasets apps,
// run as built (<build>/apps/): output independent of --workers and chunking,
// ids equal the tokenizer's (+ eod), bad lines fail or are skipped with their
// line number, unsupported Megatron flags are refused, merges match.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/sentence_splitter.h"
#include "data/wordpiece_tokenizer.h"
#include "data/tokenizer.h"
#include "tests/data/data_test_util.h"

using namespace mpitron;
using namespace mpitron::data;
using namespace mpitron::testing;

namespace {

std::string app(const std::string& name) {
  std::string p = app_path(name);
  REQUIRE_MESSAGE(!p.empty(), name << " not found under <build>/apps: build it (cmake --build <build> --target "
                                   << name << ") before running this test");
  return p;
}

const Tokenizer& gpt2() {
  static Tokenizer tok(source_path("assets/gpt2/gpt2-vocab.json"), source_path("assets/gpt2/gpt2-merges.txt"));
  return tok;
}

// A JSONL mixing LAMBADA texts, WikiText lines (some empty → empty documents),
// a second key, a list-of-sentences value, and one line longer than small chunks.
std::vector<std::string> make_corpus(const std::string& path) {
  std::vector<std::string> lambada = split_lines(read_all(source_path("assets/text/lambada_test.jsonl")));
  std::vector<std::string> wiki = split_lines(read_all(source_path("assets/text/wikitext-2.test.txt")));
  std::vector<std::string> texts;
  std::string out;
  for (size_t i = 0; i < 300; ++i) {
    std::string t = nlohmann::json::parse(lambada[i]).at("text").get<std::string>();
    if (i % 3 == 1) t = wiki[i];
    if (i == 150) t = std::string(5000, 'x') + " long line";
    texts.push_back(t);
    nlohmann::json j = {{"text", t}, {"title", "doc " + std::to_string(i)}, {"id", static_cast<int>(i)}};
    out += j.dump() + "\n";
  }
  write_all(path, out);
  return texts;
}

std::string run_pp(const std::string& args, int* rc) {
  std::string out;
  *rc = run_command(app("preprocess_data") + " " + args, &out);
  return out;
}

}  // namespace

TEST_CASE("preprocess_data: byte-identical output at --workers 1 and 3, ids equal the tokenizer's") {
  TempDir dir("pp");
  std::vector<std::string> texts = make_corpus(dir / "corpus.jsonl");
  int rc = 0;
  std::string out1 = run_pp(str("--input ", dir / "corpus.jsonl", " --output-prefix ", dir / "w1",
                                " --json-keys text title --append-eod --workers 1 --log-interval 100"), &rc);
  REQUIRE_MESSAGE(rc == 0, out1);
  CHECK(out1.find("docs/s") != std::string::npos);  // progress lines
  std::string out3 = run_pp(str("--input ", dir / "corpus.jsonl", " --output-prefix ", dir / "w3",
                                " --json-keys text title --append-eod --workers 3 --chunk-mb 0.004"), &rc);
  REQUIRE_MESSAGE(rc == 0, out3);
  for (const char* key : {"text", "title"}) {
    CHECK(read_all(dir / str("w1_", key, "_document.bin")) == read_all(dir / str("w3_", key, "_document.bin")));
    CHECK(read_all(dir / str("w1_", key, "_document.idx")) == read_all(dir / str("w3_", key, "_document.idx")));
  }
  IndexedDataset ds(dir / "w1_text_document");
  CHECK(ds.dtype() == DType::U16);
  REQUIRE(ds.document_count() == static_cast<int64_t>(texts.size()));
  Encoder enc(gpt2());
  int64_t seq = 0;
  for (size_t d = 0; d < texts.size(); ++d) {
    std::vector<int32_t> expect = enc.encode(texts[d]);
    const int64_t nseq = ds.document_indices()[d + 1] - ds.document_indices()[d];
    if (expect.empty()) {  // empty text: an empty document, no eod (Megatron)
      CHECK(nseq == 0);
      continue;
    }
    expect.push_back(gpt2().eod());
    REQUIRE(nseq == 1);
    std::vector<int32_t> got;
    ds.get(seq++).append_to(got);
    CHECK_MESSAGE(got == expect, "document " << d);
  }
}

TEST_CASE("preprocess_data: bad lines fail with their line number, or are skipped and counted") {
  TempDir dir("ppbad");
  std::string lines = std::string(R"({"text": "good one"})") + "\n" +  // 1
                      R"({"text": "good two"})" + "\n" +                // 2
                      R"({"text": "unterminated)" + "\n" +              // 3 bad JSON
                      R"({"body": "no text key"})" + "\n" +             // 4 missing key
                      "{\"text\": \"bad \xff byte\"}\n" +               // 5 invalid UTF-8
                      R"({"text": 42})" + "\n" +                        // 6 not a string
                      "\n" +                                            // 7 blank: skipped
                      R"({"text": "good three"})" + "\n";               // 8
  write_all(dir / "bad.jsonl", lines);
  int rc = 0;
  std::string out = run_pp(str("--input ", dir / "bad.jsonl", " --output-prefix ", dir / "f"), &rc);
  CHECK(rc != 0);
  CHECK_MESSAGE(out.find("bad.jsonl:3: bad JSON") != std::string::npos, out);
  CHECK(out.find("--on-error skip") != std::string::npos);

  out = run_pp(str("--input ", dir / "bad.jsonl", " --output-prefix ", dir / "s", " --on-error skip --workers 2"),
               &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  CHECK_MESSAGE(out.find("skipped 4 bad lines") != std::string::npos, out);
  for (const char* needle : {":3: bad JSON", ":4: missing key 'text'", ":5: invalid UTF-8 at byte 14",
                             ":6: key 'text' is not a string", "skipped 1 blank lines"})
    CHECK_MESSAGE(out.find(needle) != std::string::npos, needle << " not in:\n" << out);
  IndexedDataset ds(dir / "s_text_document");
  CHECK(ds.document_count() == 3);
  std::vector<int32_t> got;
  ds.get(2).append_to(got);
  CHECK(gpt2().decode(got) == "good three");
}

TEST_CASE("preprocess_data: Megatron flags that are not built are refused clearly") {
  TempDir dir("ppflags");
  write_all(dir / "in.jsonl", "{\"text\": \"x\"}\n");
  const std::string base = str("--input ", dir / "in.jsonl", " --output-prefix ", dir / "o ");
  int rc = 0;
  std::string out = run_pp(base + "--keep-newlines", &rc);
  CHECK(rc != 0);
  CHECK(out.find("--keep-newlines works only with --split-sentences") != std::string::npos);
  out = run_pp(base + "--split-sentences --lang german", &rc);
  CHECK(rc != 0);
  CHECK(out.find("--lang german is not built") != std::string::npos);
  out = run_pp(base + "--tokenizer-type BertWordPieceLowerCase", &rc);
  CHECK(rc != 0);
  CHECK(out.find("BertWordPieceLowerCase needs --vocab-file") != std::string::npos);
  out = run_pp(base + "--tokenizer-type T5Tokenizer", &rc);
  CHECK(rc != 0);
  CHECK(out.find("T5Tokenizer is not built") != std::string::npos);
  out = run_pp(base + "--on-error maybe", &rc);
  CHECK(rc != 0);
  out = run_pp(base + "--vocab-file /nonexistent/v.json", &rc);
  CHECK(rc != 0);
  CHECK(out.find("/nonexistent/v.json") != std::string::npos);
  out = run_pp(base + "--tokenizer-type GPT2BPETokenizer --partitions 1 --dataset-impl mmap", &rc);
  CHECK_MESSAGE(rc == 0, out);
}

TEST_CASE("merge_datasets: directory or prefixes; dtypes must match") {
  TempDir dir("merge");
  std::filesystem::create_directories(dir / "in");
  for (const char* f : {"mcore_uint16", "mcore_merged"})
    for (const char* ext : {".bin", ".idx"})
      write_all(dir / str("in/", f, ext), read_all(source_path(str("tests/data/interop/", f, ext))));
  std::string out;
  int rc = run_command(str(app("merge_datasets"), " --input ", dir / "in", " --output-prefix ", dir / "m"), &out);
  REQUIRE_MESSAGE(rc == 0, out);
  {
    IndexedDatasetWriter w(dir / "expect", DType::U16);
    w.add_index(dir / "in/mcore_merged");  // name order: mcore_merged < mcore_uint16
    w.add_index(dir / "in/mcore_uint16");
    w.finalize();
  }
  CHECK(read_all(dir / "m.bin") == read_all(dir / "expect.bin"));
  CHECK(read_all(dir / "m.idx") == read_all(dir / "expect.idx"));
  // Prefixes: uint16 twice equals megatron-core's own merge.
  rc = run_command(str(app("merge_datasets"), " --input ", dir / "in/mcore_uint16", " ", dir / "in/mcore_uint16",
                       " --output-prefix ", dir / "m2"),
                   &out);
  REQUIRE_MESSAGE(rc == 0, out);
  CHECK(read_all(dir / "m2.idx") == read_all(source_path("tests/data/interop/mcore_merged.idx")));
  CHECK(read_all(dir / "m2.bin") == read_all(source_path("tests/data/interop/mcore_merged.bin")));
  rc = run_command(str(app("merge_datasets"), " --input ", dir / "in/mcore_uint16", " ",
                       source_path("tests/data/interop/mcore_int32"), " --output-prefix ", dir / "m3"),
                   &out);
  CHECK(rc != 0);
  CHECK_MESSAGE(out.find("int32") != std::string::npos, out);
  CHECK_FALSE(std::filesystem::exists(dir / "m3.bin"));
}

// Ids from HF `tokenizers` / `sentencepiece` (tests/reference/llama_tokenizers_ref.py) for
// the bundled texts' first 4 KB and the edge cases, each case one document.
TEST_CASE("preprocess_data: HuggingFaceTokenizer and SentencePieceTokenizer documents equal the reference ids") {
  TempDir dir("pptok");
  auto ref = nlohmann::json::parse(read_all(source_path("tests/data/ref/llama_tokenizers_ref.json")));
  std::string jsonl;
  for (const auto& c : ref["cases"]) jsonl += nlohmann::json({{"text", c["text"]}}).dump() + "\n";
  write_all(dir / "in.jsonl", jsonl);
  struct Run {
    const char* type;
    std::string model;
    const char* key;  // reference ids: Megatron's tokenize()
    int32_t eod;
  };
  for (const Run& r : {Run{"HuggingFaceTokenizer", source_path("tests/data/ref/llama3_style/tokenizer.json"), "hf_special", 1},
                       Run{"SentencePieceTokenizer", source_path("tests/data/ref/sp_bpe.model"), "sp_megatron",
                           ref["sp_megatron_eod"].get<int32_t>()}}) {
    CAPTURE(r.type);
    int rc = 0;
    std::string out = run_pp(str("--input ", dir / "in.jsonl", " --output-prefix ", dir / r.type, " --tokenizer-type ",
                                 r.type, " --tokenizer-model ", r.model, " --append-eod --workers 2"), &rc);
    REQUIRE_MESSAGE(rc == 0, out);
    IndexedDataset ds(dir / str(r.type, "_text_document"));
    REQUIRE(ds.document_count() == static_cast<int64_t>(ref["cases"].size()));
    int64_t seq = 0;
    for (size_t d = 0; d < ref["cases"].size(); ++d) {
      CAPTURE(ref["cases"][d]["name"].get<std::string>());
      auto expect = ref["cases"][d][r.key].get<std::vector<int32_t>>();
      const int64_t nseq = ds.document_indices()[d + 1] - ds.document_indices()[d];
      if (expect.empty()) {
        CHECK(nseq == 0);
        continue;
      }
      expect.push_back(r.eod);
      REQUIRE(nseq == 1);
      std::vector<int32_t> got;
      ds.get(seq++).append_to(got);
      CHECK(got == expect);
    }
  }
  int rc = 0;
  std::string out = run_pp(str("--input ", dir / "in.jsonl", " --output-prefix ", dir / "x --tokenizer-type HuggingFaceTokenizer"), &rc);
  CHECK(rc != 0);
  CHECK(out.find("needs --tokenizer-model") != std::string::npos);
  out = run_pp(str("--input ", dir / "in.jsonl", " --output-prefix ", dir / "x --tokenizer-model ", dir / "in.jsonl"), &rc);
  CHECK(rc != 0);
  CHECK(out.find("--tokenizer-model is not used by GPT2BPETokenizer") != std::string::npos);
}

TEST_CASE("preprocess_data --split-sentences: one sequence per sentence, documents in the index, eod on the last") {
  TempDir dir("ppsent");
  auto cases = nlohmann::json::parse(read_all(source_path("tests/data/ref/sentence_cases.json")));
  std::string jsonl;
  for (const auto& c : cases) jsonl += nlohmann::json({{"text", c["text"]}}).dump() + "\n";
  jsonl += "{\"text\": \"   \"}\n";  // a document with no sentence
  write_all(dir / "in.jsonl", jsonl);
  const std::string vocab = source_path("tests/data/ref/bert_uncased/vocab.txt");
  WordPieceTokenizer tok(vocab, true);
  for (bool eod : {false, true}) {
    CAPTURE(eod);
    int rc = 0;
    std::string out = run_pp(str("--input ", dir / "in.jsonl", " --output-prefix ", dir / "b",
                                 " --split-sentences --tokenizer-type BertWordPieceLowerCase --vocab-file ", vocab,
                                 " --workers 2", eod ? " --append-eod" : ""), &rc);
    REQUIRE_MESSAGE(rc == 0, out);
    CHECK(out.find("b_text_sentence.{bin,idx}") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(dir / "b_text_document.idx"));
    IndexedDataset ds(dir / "b_text_sentence");
    CHECK(ds.dtype() == DType::U16);
    REQUIRE(ds.document_count() == static_cast<int64_t>(cases.size()) + 1);
    int64_t seq = 0;
    for (size_t d = 0; d < cases.size(); ++d) {
      const auto sents = cases[d]["sentences"].get<std::vector<std::string>>();
      CAPTURE(cases[d]["text"].get<std::string>());
      REQUIRE(ds.document_indices()[d + 1] - ds.document_indices()[d] == static_cast<int64_t>(sents.size()));
      for (size_t k = 0; k < sents.size(); ++k) {
        std::vector<int32_t> expect = tok.encode(sents[k]), got;
        if (eod && k + 1 == sents.size()) expect.push_back(tok.eod());
        ds.get(seq++).append_to(got);
        CHECK(got == expect);
      }
    }
    CHECK(ds.document_indices()[cases.size() + 1] == ds.document_indices()[cases.size()]);  // the blank document
    CHECK(seq == ds.sequence_count());
  }
}

TEST_CASE("preprocess_data --split-sentences: byte-identical to megatron-core's builder on the labelled sentences") {
  // tests/data/interop/mcore_bert_text_sentence was written by megatron-core's
  // IndexedDatasetBuilder from the hand-labelled sentences, tokenised by HF tokenizers,
  // [EOS] on each document's last sentence (tests/reference/bert_sentence_interop.py).
  TempDir dir("ppmcore");
  auto cases = nlohmann::json::parse(read_all(source_path("tests/data/ref/sentence_cases.json")));
  std::string jsonl;
  for (const auto& c : cases) jsonl += nlohmann::json({{"text", c["text"]}}).dump() + "\n";
  write_all(dir / "in.jsonl", jsonl);
  int rc = 0;
  std::string out = run_pp(str("--input ", dir / "in.jsonl", " --output-prefix ", dir / "ours",
                               " --split-sentences --tokenizer-type BertWordPieceLowerCase --vocab-file ",
                               source_path("tests/data/ref/bert_uncased/vocab.txt"), " --append-eod"), &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  for (const char* ext : {".bin", ".idx"}) {
    CAPTURE(ext);
    CHECK(read_all(dir / str("ours_text_sentence", ext)) ==
          read_all(source_path(str("tests/data/interop/mcore_bert_text_sentence", ext))));
  }
}

TEST_CASE("preprocess_data --split-sentences --keep-newlines: each sentence keeps the whitespace after it") {
  TempDir dir("ppnl");
  const std::string text = "First one.\n\nSecond one!\nThird\nline.";
  write_all(dir / "in.jsonl", nlohmann::json({{"text", text}}).dump() + "\n");
  for (bool keep : {false, true}) {
    int rc = 0;
    std::string out = run_pp(str("--input ", dir / "in.jsonl", " --output-prefix ", dir / "g", " --split-sentences",
                                 keep ? " --keep-newlines" : ""), &rc);
    REQUIRE_MESSAGE(rc == 0, out);
    IndexedDataset ds(dir / "g_text_sentence");
    REQUIRE(ds.sequence_count() == 3);
    std::vector<std::string> got;
    for (int64_t i = 0; i < 3; ++i) {
      std::vector<int32_t> ids;
      ds.get(i).append_to(ids);
      got.push_back(gpt2().decode(ids));
    }
    CHECK(got == (keep ? std::vector<std::string>{"First one.\n\n", "Second one!\n", "Third\nline."}
                       : std::vector<std::string>{"First one.", "Second one!", "Third\nline."}));
  }
}
