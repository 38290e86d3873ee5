// tests/data/test_sentence_splitter.cpp — the rule-based sentence splitter of
// `preprocess_data --split-sentences` on hand-labelled cases (tests/data/ref/
// sentence_cases.json: abbreviations, initials, decimals, ellipses, quotes and brackets
// after the mark, CJK, Cyrillic, lower-case continuations), and --keep-newlines.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

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
