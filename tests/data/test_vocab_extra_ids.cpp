// tests/data/test_vocab_extra_ids.cpp — --vocab-extra-ids N as a tokenizer setting (Megatron's
// _BertWordPieceTokenizer(vocab_file, lower_case, vocab_extra_ids)): [BOS], [EOS] then <extra_id_0> …
// <extra_id_{N−1}> appended; the sentinels are special in text (ids from HF tokenizers with them added as
// special tokens: tests/reference/wordpiece_extra_ids_ref.py); T5Vocab::from gives the same ids with or
// without them already in the tokenizer; the checkpoint identity records N only when N > 0.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/t5_dataset.h"
#include "data/text_tokenizer.h"
#include "data/wordpiece_tokenizer.h"
#include "tests/data/data_test_util.h"
#include "tests/error_of.h"  // error_of

using namespace mpitron;
using mpitron::testing_util::error_of;
using namespace mpitron::data;
using namespace mpitron::testing;

namespace {

std::string vocab() { return source_path("tests/data/ref/bert_uncased/vocab.txt"); }
TokenizerSpec spec(int64_t extra) {
  TokenizerSpec s{"BertWordPieceLowerCase", "", vocab(), ""};
  s.vocab_extra_ids = extra;
  return s;
}

}  // namespace

TEST_CASE("--vocab-extra-ids: sentinels appended after [BOS] [EOS], special in text as in HF tokenizers") {
  const auto tok = make_tokenizer(spec(100));
  CHECK(tok->vocab_size() == 2102);  // HF: get_vocab_size(with_added_tokens=True)
  CHECK(tok->bos() == 2000);
  CHECK(tok->eod() == 2001);
  CHECK(tok->token_to_id("<extra_id_0>") == 2002);
  CHECK(tok->token_to_id("<extra_id_99>") == 2101);
  CHECK(tok->token_to_id("<extra_id_100>") == -1);
  CHECK(tok->encode("The cat <extra_id_0> on the <extra_id_17> mat.") ==
        std::vector<int32_t>{230, 745, 170, 2002, 277, 230, 2019, 982, 170, 18});
  CHECK(tok->encode("<extra_id_99><extra_id_3>x") == std::vector<int32_t>{2101, 2005, 66});
  CHECK(tok->encode("no <extra_id_100> or <extra_id_> or <Extra_id_1> here") ==
        std::vector<int32_t>{281, 32, 1582, 764, 41, 51, 171, 41, 1139, 178, 34, 409, 32, 1582, 764, 41,
                             51, 171, 41, 34, 409, 32, 1582, 764, 41, 51, 171, 41, 21, 34, 584});
  CHECK(tok->encode("Hello [MASK] world <extra_id_5>") == std::vector<int32_t>{1814, 172, 4, 856, 2007});
  // Without extra ids "<extra_id_0>" is ordinary text, and the vocabulary ends at [EOS].
  const auto plain = make_tokenizer(spec(0));
  CHECK(plain->vocab_size() == 2002);
  CHECK(plain->encode("<extra_id_0>").size() > 1);
  // decode prints the sentinels as written.
  CHECK(tok->decode(std::vector<int32_t>{2002, 230, 2019}) == "<extra_id_0> the <extra_id_17>");
}

TEST_CASE("T5Vocab::from gives the same ids whether or not the tokenizer already has the sentinels") {
  const auto plain = make_tokenizer(spec(0));
  for (int64_t n : {1, 7, 100}) {
    CAPTURE(n);
    const auto with = make_tokenizer(spec(n));
    const T5Vocab a = T5Vocab::from(*plain, n), b = T5Vocab::from(*with, n);
    CHECK(a.sentinels == b.sentinels);
    CHECK(a.vocab_size == b.vocab_size);
    CHECK(b.vocab_size == with->vocab_size());
    CHECK(a.bos == b.bos);
    CHECK(a.eos == b.eos);
    CHECK(a.continuation == b.continuation);
    for (int64_t j = 0; j < n; ++j) CHECK(b.sentinels[j] == with->token_to_id("<extra_id_" + std::to_string(j) + ">"));
  }
}

TEST_CASE("tokenizer_identity records vocab_extra_ids only when > 0; a different count is a difference") {
  const auto plain = make_tokenizer(spec(0)), with = make_tokenizer(spec(100)), few = make_tokenizer(spec(50));
  const nlohmann::json a = tokenizer_identity(spec(0), *plain), b = tokenizer_identity(spec(100), *with),
                       c = tokenizer_identity(spec(50), *few);
  CHECK_FALSE(a.contains("vocab_extra_ids"));
  CHECK(b["vocab_extra_ids"] == 100);
  CHECK(b["vocab_size"] == 2102);
  CHECK(tokenizer_difference(b, b).empty());
  CHECK(tokenizer_difference(b, c).find("--vocab-extra-ids 100 -> 50") != std::string::npos);
  CHECK(tokenizer_difference(a, b).find("--vocab-extra-ids 0 -> 100") != std::string::npos);
  CHECK(describe_tokenizer_identity(b).find("--vocab-extra-ids 100") != std::string::npos);
  TokenizerSpec gpt2;
  gpt2.vocab_extra_ids = 3;
  CHECK(error_of([&] { make_tokenizer(gpt2); }).find("--vocab-extra-ids") != std::string::npos);
}
