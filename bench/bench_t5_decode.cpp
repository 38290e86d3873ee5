// bench_t5_decode — T5's decoder step time at several generated lengths: the cached decoder
// (model/t5_decode.h: the new token only, over the self-attention cache and the cross-attention keys
// and values computed once) against the full recompute of T5::greedy_recompute (every step reruns the
// decoder over all the tokens so far).
//   bench_t5_decode [--hidden 256] [--heads 8] [--kv 32] [--ffn 1024] [--layers 4] [--vocab 32128]
//                   [--enc 64] [--lengths 8,32,64,128,256] [--reps 5] [--json FILE]
// A random T5 (relative positions, ReLU MLP, tied head: t5-small's shape scaled by the flags; --layers
// encoder and as many decoder layers), f32, one process, the CPU or the GPU when there is one.
//   cached ms:     the decoder's step at position L (a fresh state fed L tokens first in one call; then
//                  `reps` single-token steps at L, L+1, …; their median), logits of the new row included.
//   recompute ms:  the old step at length L: T5::logits over (encoder Te, decoder L) minus T5::encode
//                  (the old greedy ran the encoder once and the decoder, output layer included, over all
//                  L rows each step); medians of `reps`.
// The cached step's matmuls do not depend on L (only its attention over L cached keys and its bias row
// do); the recompute's grow with L.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/timer.h"
#include "model/inference/hf_convert.h"
#include "model/t5.h"
#include "model/t5_decode.h"

using namespace mpitron;

namespace {

struct Flags {
  int64_t hidden = 256, heads = 8, kv = 32, ffn = 1024, layers = 4, vocab = 32128, enc = 64, reps = 5;
  std::vector<int64_t> lengths = {8, 32, 64, 128, 256};
  std::string json;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    MPT_CHECK(i + 1 < argc, str(k, " needs a value"), "the flags are listed at the top of bench/bench_t5_decode.cpp");
    const std::string v = argv[++i];
    if (k == "--hidden") f.hidden = std::stoll(v);
    else if (k == "--heads") f.heads = std::stoll(v);
    else if (k == "--kv") f.kv = std::stoll(v);
    else if (k == "--ffn") f.ffn = std::stoll(v);
    else if (k == "--layers") f.layers = std::stoll(v);
    else if (k == "--vocab") f.vocab = std::stoll(v);
    else if (k == "--enc") f.enc = std::stoll(v);
    else if (k == "--reps") f.reps = std::stoll(v);
    else if (k == "--json") f.json = v;
    else if (k == "--lengths") {
      f.lengths.clear();
      std::stringstream ss(v);
      for (std::string x; std::getline(ss, x, ',');) f.lengths.push_back(std::stoll(x));
    } else {
      MPT_THROW(str("unknown flag ", k), "see the header of bench/bench_t5_decode.cpp");
    }
  }
  return f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Tensor ids(int64_t n, int64_t vocab, uint64_t salt) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<int64_t>((i * 7919 + salt * 104729 + 13) % (vocab - 2)) + 2);
  return Tensor::from_ints(v, {1, n}, DType::I32);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags f = parse(argc, argv);
    const nlohmann::json hf = {{"model_type", "t5"},        {"architectures", {"T5ForConditionalGeneration"}},
                               {"d_model", f.hidden},       {"d_kv", f.kv},
                               {"num_heads", f.heads},      {"d_ff", f.ffn},
                               {"vocab_size", f.vocab},     {"num_layers", f.layers},
                               {"num_decoder_layers", f.layers}, {"feed_forward_proj", "relu"},
                               {"relative_attention_num_buckets", 32}, {"relative_attention_max_distance", 128}};
    const GPTConfig cfg = hf_config(hf.dump(), 128);
    const Device dev = cuda_available() ? Device::cuda(0) : Device::cpu();
    T5 m(cfg, dev);
    m.init_weights(1234);
    const Tensor enc = ids(f.enc, f.vocab, 1).to(dev);
    std::printf("bench_t5_decode: T5 %lld+%lld layers, hidden %lld, %lld heads of %lld, ffn %lld, vocab %lld, encoder %lld "
                "tokens, f32 on %s; median of %lld\n",
                (long long)f.layers, (long long)f.layers, (long long)f.hidden, (long long)f.heads, (long long)f.kv,
                (long long)f.ffn, (long long)cfg.vocab_size, (long long)f.enc, dev.is_cuda() ? "cuda" : "cpu",
                (long long)f.reps);
    std::printf("%8s %14s %16s %10s\n", "length", "cached ms/step", "recompute ms/step", "ratio");
    nlohmann::json rows = nlohmann::json::array();
    for (const int64_t L : f.lengths) {
      const Tensor dec = ids(L, f.vocab, 2);
      const std::vector<int64_t> prefix = dec.to_ints();
      // Cached: a state holding L positions, then single steps at L, L+1, ….
      T5DecodeState st(m, enc, f.enc, L + f.reps);
      st.step(prefix);
      std::vector<double> cached;
      for (int64_t r = 0; r < f.reps; ++r) {
        Timer t;
        st.step({prefix[static_cast<size_t>(r % L)]});
        cached.push_back(t.ms());
      }
      // Recompute: the decoder over L rows (T5::logits − T5::encode).
      T5Batch b;
      b.enc = enc;
      b.dec = dec;
      b.labels = Tensor::from_ints(std::vector<int64_t>(static_cast<size_t>(L), -1), {1, L}, DType::I32);
      b.enc_lengths = Tensor::from_ints({f.enc}, {1}, DType::I32);
      std::vector<double> full, encode;
      for (int64_t r = 0; r < f.reps; ++r) {
        Timer t;
        m.logits(b);
        full.push_back(t.ms());
        t.reset();
        m.encode(enc, Tensor()).to(Device::cpu());
        encode.push_back(t.ms());
      }
      const double c = median(cached), rc = std::max(median(full) - median(encode), 0.0);
      std::printf("%8lld %14.2f %16.2f %9.1fx\n", (long long)L, c, rc, rc / c);
      rows.push_back({{"length", L}, {"cached_ms", c}, {"recompute_ms", rc}, {"encode_ms", median(encode)}});
    }
    if (!f.json.empty()) {
      std::ofstream(f.json) << nlohmann::json{{"device", dev.is_cuda() ? "cuda" : "cpu"}, {"rows", rows}}.dump(2) << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
