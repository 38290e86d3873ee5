// Helpers shared by the tests/apps suites: temp dirs, running the built apps.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "tensor/tensor.h"

namespace apps_test {

inline const std::string kSource = MPITRON_SOURCE_DIR;

// A fresh directory under the system temp dir, removed by the destructor.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    std::string tmpl = (std::filesystem::temp_directory_path() / ("mpitron_" + tag + "_XXXXXX")).string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

inline std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The uncased WordPiece vocabulary of the BERT and T5 app tests (2000 words).
inline const std::string kBertVocab = kSource + "/tests/data/ref/bert_uncased/vocab.txt";

// The first `docs` WikiText-2 paragraphs (lines of more than 200 characters) of the validation, then
// the test file (3208 in all), as JSON lines.
inline void write_wiki_corpus(const std::string& path, size_t docs) {
  std::ofstream out(path);
  size_t n = 0;
  for (const char* file : {"valid", "test"}) {
    std::istringstream in(slurp(kSource + "/assets/text/wikitext-2." + file + ".txt"));
    std::string line;
    while (n < docs && std::getline(in, line))
      if (line.size() > 200) {
        out << nlohmann::json({{"text", line}}).dump() << "\n";
        ++n;
      }
  }
}

// Runs a built app (the tests' working directory is the build dir: apps/<name>) with a
// shell command line; stdout+stderr go to log. Returns the exit status.
inline int run_app(const std::string& name, const std::string& args, const std::string& log) {
  const std::string cmd = "OMP_NUM_THREADS=1 apps/" + name + " " + args + " > " + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

// A sentence dataset (preprocess_data --split-sentences with kBertVocab) of the first `docs` paragraphs,
// written under dir; returns its prefix (…_text_sentence).
inline std::string wiki_sentence_data(const TempDir& dir, size_t docs) {
  write_wiki_corpus(dir / "wiki.jsonl", docs);
  REQUIRE(run_app("preprocess_data", "--input " + (dir / "wiki.jsonl") + " --output-prefix " + (dir / "wiki") +
                                         " --split-sentences --tokenizer-type BertWordPieceLowerCase --vocab-file " +
                                         kBertVocab + " --workers 1",
                  dir / "pp.log") == 0);
  return dir / "wiki_text_sentence";
}

// HF export at BF16 (torch_dtype bfloat16, `tensor` stored BF16), import (widened exactly)
// and export again: the same bytes. ckpt: an mpitron checkpoint; files go under tmp.
inline void check_hf_bf16_round_trip(const std::string& ckpt, const TempDir& tmp, const std::string& tensor) {
  REQUIRE(run_app("convert_checkpoint", "--direction mpitron-to-hf --dtype BF16 --input " + ckpt + " --output " + tmp / "bf16",
                  tmp / "bf.log") == 0);
  CHECK(nlohmann::json::parse(slurp(tmp / "bf16/config.json"))["torch_dtype"] == "bfloat16");
  CHECK(mpitron::io::read_safetensors(tmp / "bf16/model.safetensors").at(tensor).dtype == "BF16");
  REQUIRE(run_app("convert_checkpoint", "--direction hf-to-mpitron --input " + tmp / "bf16" + " --output " + tmp / "ckbf",
                  tmp / "bf2.log") == 0);
  REQUIRE(run_app("convert_checkpoint", "--direction mpitron-to-hf --dtype BF16 --input " + tmp / "ckbf" + " --output " +
                      tmp / "bf16b", tmp / "bf3.log") == 0);
  CHECK(slurp(tmp / "bf16b/model.safetensors") == slurp(tmp / "bf16/model.safetensors"));
}

// The (B, T) token ids of a reference's "ids" rows (tests/reference/hf_*_ref.py).
inline mpitron::Tensor ints(const nlohmann::json& rows) {
  std::vector<int64_t> v;
  for (const auto& r : rows)
    for (const auto& x : r) v.push_back(x.get<int64_t>());
  return mpitron::Tensor::from_ints(v, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
}

// Max |logit - reference| over the first V columns of (B·T, Vp) logits; want: (B, T, V) rows.
inline double logit_err(const mpitron::Tensor& logits, const nlohmann::json& want, int64_t V) {
  const std::vector<float> lg = logits.to_floats();
  const int64_t Vp = logits.dim(1);
  double worst = 0;
  int64_t row = 0;
  for (const auto& b : want)
    for (const auto& t : b) {
      for (int64_t v = 0; v < V; ++v)
        worst = std::max(worst, std::abs(double(lg[static_cast<size_t>(row * Vp + v)]) -
                                         t[static_cast<size_t>(v)].get<double>()));
      ++row;
    }
  return worst;
}

// The reference venv's interpreter (scripts/setup-reference-venv.sh: MPITRON_REF_VENV, <repo>/.venv-ref or
// /work/.venv-ref), or "" when none imports torch and transformers (the tests that need it then skip).
inline std::string venv_python() {
  const char* v = std::getenv("MPITRON_REF_VENV");
  for (const std::string d : {std::string(v ? v : ""), kSource + "/.venv-ref", std::string("/work/.venv-ref")}) {
    if (d.empty()) continue;
    const std::string py = d + "/bin/python";
    if (std::system(("'" + py + "' -c 'import torch, transformers' > /dev/null 2>&1").c_str()) == 0) return py;
  }
  return "";
}

}  // namespace apps_test
