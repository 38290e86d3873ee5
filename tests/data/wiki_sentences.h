// tests/data/wiki_sentences.h — the fixtures the BERT and T5 dataset tests share: the
// sentence-level WikiText dataset and uncased BERT vocabulary of tests/data/ref (written by
// tests/reference/bert_dataset_ref.py), and a reference JSON file parsed once.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/gpt_dataset.h"  // DocRange
#include "data/indexed_dataset.h"
#include "data/wordpiece_tokenizer.h"
#include "tests/data/data_test_util.h"

namespace mpitron::testing {

inline const nlohmann::json& ref_json(const std::string& name) {  // tests/data/ref/<name>
  static std::map<std::string, nlohmann::json> parsed;
  auto it = parsed.find(name);
  if (it == parsed.end()) it = parsed.emplace(name, nlohmann::json::parse(read_all(source_path("tests/data/ref/" + name)))).first;
  return it->second;
}
inline const data::WordPieceTokenizer& bert_uncased() {
  static data::WordPieceTokenizer t(source_path("tests/data/ref/bert_uncased/vocab.txt"), true);
  return t;
}
inline std::shared_ptr<const data::IndexedDataset> wiki_sentences() {
  static auto d = std::make_shared<const data::IndexedDataset>(source_path("tests/data/ref/bert_ds/wiki_text_sentence"));
  return d;
}
inline data::DocRange all_wiki_docs() { return {0, wiki_sentences()->document_count()}; }
template <typename T> std::vector<int64_t> as64(const std::vector<T>& v) { return std::vector<int64_t>(v.begin(), v.end()); }

}  // namespace mpitron::testing
