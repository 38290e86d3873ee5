// tests/model/model_test_util.h — a fresh temp directory and a toy Megatron
// dataset for the trainer tests.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "data/indexed_dataset.h"
#include "model/training/arguments.h"

namespace mpitron::testing {

// <tmp>/mpitron_<name>_<pid>, emptied.
inline std::filesystem::path fresh_temp_dir(const std::string& name) {
  std::filesystem::path p = std::filesystem::temp_directory_path() / ("mpitron_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

// `docs` documents of 5..60 GPT-2 token ids ending in EOD, u16 as Megatron
// writes them, from a skewed distribution over a small range so a model has
// something to learn. Returns the prefix <dir>/toy_text_document.
inline std::string write_toy_dataset(const std::filesystem::path& dir, uint32_t seed, int docs) {
  const std::string prefix = (dir / "toy_text_document").string();
  data::IndexedDatasetWriter w(prefix, data::DType::U16);
  std::mt19937 rng(seed);
  std::vector<int32_t> doc;
  for (int d = 0; d < docs; ++d) {
    doc.resize(5 + rng() % 56);
    for (int32_t& t : doc) t = static_cast<int32_t>((rng() % 97) * (rng() % 5) + 10);
    doc.back() = 50256;
    w.add_tokens(doc.data(), static_cast<int64_t>(doc.size()));
    w.end_document();
  }
  w.finalize();
  return prefix;
}

// pretrain_gpt's flags parsed as the app parses them, with the GPT-2 vocabulary
// the toy data uses (50257, padded to 50304).
inline TrainArgs parse_flags(std::vector<std::string> flags) {
  std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
  for (auto& f : flags) argv.push_back(f.data());
  TrainArgs a;
  REQUIRE(parse_train_args(static_cast<int>(argv.size()), argv.data(), a));
  a.model.vocab_size = 50257;
  a.model.padded_vocab_size = 50304;
  return a;
}

}  // namespace mpitron::testing
