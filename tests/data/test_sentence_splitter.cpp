// tests/data/test_sentence_splitter.cpp — the rule-based sentence splitter of
// `preprocess_data --split-sentences` on hand-labelled cases (tests/data/ref/
// sentence_cases.json: abbreviations, initials, decimals, ellipses, quotes and brackets
// after the mark, CJK, Cyrillic, lower-case continuations), and --keep-newlines.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "data/sentence_splitter.h"
#include "tests/data/data_test_util.h"

using namespace mpitron;
using namespace mpitron::data;
using namespace mpitron::testing;

namespace {
std::vector<std::string> split(std::string_view text, bool keep = false) {
  std::vector<std::string> out;
  for (std::string_view s : split_sentences(text, keep)) out.emplace_back(s);
  return out;
}
}  // namespace

TEST_CASE("split_sentences: every hand-labelled case") {
  auto cases = nlohmann::json::parse(read_all(source_path("tests/data/ref/sentence_cases.json")));
  REQUIRE(cases.size() >= 30);
  int agree = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    CAPTURE(text);
    const auto want = c["sentences"].get<std::vector<std::string>>();
    CHECK(split(text) == want);
    agree += split(text) == want;
  }
  MESSAGE(agree, " of ", cases.size(), " hand-labelled cases split as labelled");
}

TEST_CASE("split_sentences: empty and blank texts have no sentence; whitespace is trimmed") {
  CHECK(split("").empty());
  CHECK(split(" \n\t ").empty());
  CHECK(split("  One.  Two.  ") == std::vector<std::string>{"One.", "Two."});
  CHECK(split("No stop at the end") == std::vector<std::string>{"No stop at the end"});
  CHECK(split(".") == std::vector<std::string>{"."});
  CHECK(split("Hi. \xff Bye.") == std::vector<std::string>{"Hi. \xff Bye."});  // invalid byte: not a sentence start
}

TEST_CASE("split_sentences: keep_newlines keeps the whitespace after each sentence") {
  const std::string text = "  First one.\n\nSecond one!\nThird\nline.  ";
  CHECK(split(text, true) == std::vector<std::string>{"First one.\n\n", "Second one!\n", "Third\nline.  "});
  CHECK(split(text, false) == std::vector<std::string>{"First one.", "Second one!", "Third\nline."});
  std::string joined;
  for (const auto& s : split(text, true)) joined += s;
  CHECK(joined == text.substr(2));
}

TEST_CASE("split_sentences: boundaries agree with NLTK punkt (trained on LAMBADA) on 200 LAMBADA passages") {
  // tests/reference/sentence_punkt_ref.py: punkt's sentences; compare sentence end offsets.
  auto ref = nlohmann::json::parse(read_all(source_path("tests/data/ref/punkt_sentences.json")));
  int64_t both = 0, ours_only = 0, punkt_only = 0, same_passages = 0;
  int shown = 0;
  for (const auto& c : ref) {
    const std::string text = c["text"].get<std::string>();
    std::set<size_t> punkt, ours;
    size_t cursor = 0;
    for (const auto& s : c["sentences"]) {
      const std::string sent = s.get<std::string>();
      const size_t at = text.find(sent, cursor);
      REQUIRE(at != std::string::npos);
      cursor = at + sent.size();
      punkt.insert(cursor);
    }
    for (std::string_view s : split_sentences(text)) ours.insert(static_cast<size_t>(s.data() - text.data()) + s.size());
    for (size_t e : ours) (punkt.count(e) ? both : ours_only) += 1;
    for (size_t e : punkt) punkt_only += !ours.count(e);
    same_passages += ours == punkt;
    for (size_t e : ours)
      if (!punkt.count(e) && shown++ < 6)
        MESSAGE("ours only: ..." << text.substr(e >= 40 ? e - 40 : 0, std::min<size_t>(e, 40)) << "|" << text.substr(e, 30));
    for (size_t e : punkt)
      if (!ours.count(e) && shown++ < 12)
        MESSAGE("punkt only: ..." << text.substr(e >= 40 ? e - 40 : 0, std::min<size_t>(e, 40)) << "|" << text.substr(e, 30));
  }
  const double precision = static_cast<double>(both) / (both + ours_only), recall = static_cast<double>(both) / (both + punkt_only);
  MESSAGE("punkt agreement: ", both, " common boundaries, ", ours_only, " ours only, ", punkt_only, " punkt only; precision ",
          precision, ", recall ", recall, "; ", same_passages, " of ", ref.size(), " passages split identically");
  CHECK(precision > 0.97);
  CHECK(recall > 0.97);
}
