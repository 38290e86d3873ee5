// bench/bench_data.cpp — data pipeline throughput, printed as a table:
//   1. GPT-2 tokenizer MB/s on one core over every line of the bundled texts
//      (cold: fresh Encoder each run; best of 3). With --reference, runs
//      bench/bench_tokenizer_ref.py (Hugging Face tokenizers and tiktoken on one
//      thread, same lines) and prints its numbers beside ours.
//   2. preprocess_data end to end on >= --mb MB of JSON lines (bundled texts
//      repeated, generated in a temp dir) at 1 and 2 workers.
//   3. GPT index build (doc_idx, sample_idx, shuffle_idx) for 10^8 tokens.
// Usage: bench_data [--reference] [--mb 50] [--json out.json]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/timer.h"
#include "data/gpt_dataset.h"
#include "data/tokenizer.h"

#ifndef MPITRON_SOURCE_DIR
#define MPITRON_SOURCE_DIR "."
#endif

using namespace mpitron;
using namespace mpitron::data;
namespace fs = std::filesystem;

namespace {

std::string read_all(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  MPT_CHECK(f, str("cannot open ", path), "");
  std::string s;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

std::vector<std::string> split_lines(const std::string& data) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < data.size();) {
    size_t nl = data.find('\n', pos);
    if (nl == std::string::npos) nl = data.size();
    out.emplace_back(data.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

std::string source_dir() {
  // The bench binary lives in <build>/bench; the source dir is a compile-time
  // constant of mpitron_data's assets, reachable through the default vocab path.
  fs::path vocab = Tokenizer::default_vocab_file();
  return vocab.parent_path().parent_path().parent_path().string();  // <src>/assets/gpt2/x → <src>
}

// Lines as tests/reference/tokenize_ref.py defines them (jsonl: the "text" field).
std::vector<std::string> bundled_lines() {
  std::vector<std::string> lines;
  const std::string dir = source_dir() + "/assets/text/";
  for (const char* f : {"tinyshakespeare.txt", "wikitext-2.test.txt"})
    for (auto& l : split_lines(read_all(dir + f))) lines.push_back(std::move(l));
  for (auto& l : split_lines(read_all(dir + "lambada_test.jsonl")))
    lines.push_back(nlohmann::json::parse(l).at("text").get<std::string>());
  return lines;
}

std::string self_dir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  return fs::path(buf).parent_path().string();
}

int run(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

struct Row {
  std::string what, value, note;
};

}  // namespace

int main(int argc, char** argv) {
  bool reference = false;
  double mb = 50;
  std::string json_out;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reference")) reference = true;
    else if (!std::strcmp(argv[i], "--mb") && i + 1 < argc) mb = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_out = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_data [--reference] [--mb 50] [--json out.json]\n");
      return 2;
    }
  }
  try {
    std::vector<Row> rows;
    nlohmann::json js;

    // 1. tokenizer, one core.
    Tokenizer tok(Tokenizer::default_vocab_file(), Tokenizer::default_merges_file());
    std::vector<std::string> lines = bundled_lines();
    size_t bytes = 0;
    for (const auto& l : lines) bytes += l.size();
    double best = 1e30, warm = 1e30;
    size_t ntok = 0;
    for (int rep = 0; rep < 3; ++rep) {
      Encoder enc(tok);
      std::vector<int32_t> ids;
      Timer t;
      ntok = 0;
      for (const auto& l : lines) {
        ids.clear();
        enc.encode(l, ids);
        ntok += ids.size();
      }
      best = std::min(best, t.seconds());
      t.reset();
      for (const auto& l : lines) {
        ids.clear();
        enc.encode(l, ids);
      }
      warm = std::min(warm, t.seconds());
    }
    const double ours = bytes / best / 1e6;
    rows.push_back({"tokenizer, 1 core, cold cache", str(ours, " MB/s"),
                    str(lines.size(), " lines, ", bytes / 1e6, " MB, ", ntok, " tokens")});
    rows.push_back({"tokenizer, 1 core, warm cache", str(bytes / warm / 1e6, " MB/s"), "same lines again"});
    js["tokenizer_mb_s"] = ours;
    js["tokenizer_warm_mb_s"] = bytes / warm / 1e6;
    if (reference) {
      std::string out;
      const std::string script = source_dir() + "/bench/bench_tokenizer_ref.py";
      int rc = run("python3 " + script, &out);
      if (rc != 0) {
        rows.push_back({"reference tokenizers", "unavailable", "python3 " + script + " failed: " + out.substr(0, 200)});
      } else {
        for (const auto& l : split_lines(out)) {
          char name[128];
          double mbs;
          long long n;
          if (std::sscanf(l.c_str(), "REF %127s %lf %lld", name, &mbs, &n) == 3) {
            rows.push_back({str("reference ", name), str(mbs, " MB/s"),
                            str(n == static_cast<long long>(ntok) ? "same token count" : "other token count (whole files)",
                                ", ours/ref = ", ours / mbs)});
            js["reference"][name] = mbs;
          }
        }
      }
    }

    // 2. preprocess_data end to end.
    const std::string app = self_dir() + "/../apps/preprocess_data";
    if (!fs::exists(app)) {
      rows.push_back({"preprocess_data", "not built", app});
    } else {
      fs::path tmp = fs::temp_directory_path() / str("mpitron_bench_data_", ::getpid());
      fs::create_directories(tmp);
      const std::string input = (tmp / "corpus.jsonl").string();
      {
        FILE* f = std::fopen(input.c_str(), "wb");
        MPT_CHECK(f, str("cannot write ", input), "");
        size_t written = 0;
        for (int rep = 0; written < mb * 1e6; ++rep)
          for (size_t i = 0; i < lines.size() && written < mb * 1e6; ++i) {
            if (lines[i].empty()) continue;
            std::string j = nlohmann::json{{"text", lines[i]}, {"rep", rep}}.dump() + "\n";
            written += std::fwrite(j.data(), 1, j.size(), f);
          }
        std::fclose(f);
      }
      const double in_mb = fs::file_size(input) / 1e6;
      std::string first_bin;
      for (int workers : {1, 2}) {
        std::string out;
        const std::string prefix = (tmp / str("w", workers)).string();
        Timer t;
        int rc = run(str(app, " --input ", input, " --output-prefix ", prefix,
                         " --append-eod --log-interval 0 --workers ", workers),
                     &out);
        const double s = t.seconds();
        MPT_CHECK(rc == 0, str("preprocess_data failed: ", out), "");
        std::string bin = read_all(prefix + "_text_document.bin");
        bool same = first_bin.empty() || bin == first_bin;
        if (first_bin.empty()) first_bin = std::move(bin);
        rows.push_back({str("preprocess_data, --workers ", workers), str(in_mb / s, " MB/s"),
                        str(in_mb, " MB JSONL in ", s, " s (incl. vocab load)", same ? "" : ", OUTPUT DIFFERS")});
        js["preprocess_mb_s"][std::to_string(workers)] = in_mb / s;
      }
      fs::remove_all(tmp);
    }

    // 3. GPT index build for 10^8 tokens (document lengths ~ U[100, 2000]).
    {
      std::mt19937_64 g(1);
      std::uniform_int_distribution<int64_t> len(100, 2000);
      std::vector<int64_t> docs;
      int64_t total = 0;
      while (total < 100000000) {
        docs.push_back(len(g));
        total += docs.back();
      }
      const int64_t seq = 1024, samples = 2 * total / seq + 1000;  // 3 epochs, short last one
      Timer t;
      GPTIndices idx = build_gpt_indices(docs, DocRange{0, static_cast<int64_t>(docs.size())}, seq, samples, 1234);
      const double s = t.seconds();
      rows.push_back({"GPT index build, 1e8 tokens", str(s, " s"),
                      str(docs.size(), " docs, seq 1024, ", idx.num_samples(), " samples, ", idx.num_epochs,
                          " epochs")});
      js["index_build_s_1e8_tokens"] = s;
    }

    std::printf("%-38s %-16s %s\n", "benchmark", "result", "notes");
    std::printf("%s\n", std::string(100, '-').c_str());
    for (const auto& r : rows) std::printf("%-38s %-16s %s\n", r.what.c_str(), r.value.c_str(), r.note.c_str());
    if (!json_out.empty()) {
      FILE* f = std::fopen(json_out.c_str(), "wb");
      if (f) {
        std::string s = js.dump(2) + "\n";
        std::fwrite(s.data(), 1, s.size(), f);
        std::fclose(f);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data: %s\n", e.what());
    return 1;
  }
}
