#include "model/inference/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/philox.h"
#include "model/layers/model_ends.h"
#include "tensor/ops.h"

namespace mpitron {

namespace {

Tensor ids_tensor(const std::vector<int64_t>& v, Device d) {
  return Tensor::from_ints(v, {static_cast<int64_t>(v.size())}, DType::I32).to(d);
}
}  // namespace

void SamplingParams::validate() const {
  MPT_CHECK(std::isfinite(temperature) && temperature >= 0.0f, str("temperature must be >= 0, got ", temperature),
            "use 0 (or greedy) for argmax decoding, 1 for the model's distribution");
  MPT_CHECK(top_k >= 0, str("top_k must be >= 0, got ", top_k), "0 disables top-k");
  MPT_CHECK(top_p >= 0.0f && top_p <= 1.0f, str("top_p must be in [0, 1], got ", top_p), "0 disables top-p");
  // Megatron refuses the pair too ("cannot set both greedy and top-p samplings"): which one wins is not obvious.
  MPT_CHECK(!(top_k > 0 && top_p > 0.0f), str("top_k ", top_k, " and top_p ", top_p, " are both set"),
            "sample with top_k or with top_p, not both (0 turns either off)");
}

// ---------------------------------------------------------------------------
// KV cache decoder

KVCacheDecoder::KVCacheDecoder(GPT& model, int64_t batch, int64_t max_len, bool force_ops_attention)
    : model_(model), batch_(batch), tmax_(max_len), force_ops_(force_ops_attention) {
  const GPTConfig& c = model.config();
  MPT_CHECK(batch >= 1, str("generation batch must be >= 1, got ", batch), "");
  MPT_CHECK(max_len >= 1 && max_len <= c.max_position_embeddings,
            str("KV cache length ", max_len, " must be in [1, max_position_embeddings = ", c.max_position_embeddings, "]"),
            "ask for fewer tokens");
  len_.assign(static_cast<size_t>(batch), 0);
  const Shape cache{batch, c.query_groups(), max_len, c.head_dim()};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    k_cache_.push_back(Tensor::zeros(cache, c.compute_dtype, model.device()));
    v_cache_.push_back(Tensor::zeros(cache, c.compute_dtype, model.device()));
  }
}

Tensor KVCacheDecoder::embed(const std::vector<int64_t>& ids, const std::vector<int64_t>& pos) {
  Tape tape;
  tape.set_recording(false);
  EmbedRows rows;
  rows.ids = ids_tensor(ids, model_.device());
  rows.positions = pos;
  return embed_tokens(tape, model_.config(), TensorParallel{}, model_.params(), rows, 0.0f, 0).value();
}

std::vector<float> KVCacheDecoder::prefill(int64_t b, const std::vector<int32_t>& prompt) {
  const int64_t T = static_cast<int64_t>(prompt.size());
  MPT_CHECK(b >= 0 && b < batch_, str("sequence ", b, " outside the batch of ", batch_), "");
  MPT_CHECK(T >= 1 && T <= tmax_, str("prompt of ", T, " tokens does not fit the KV cache of ", tmax_, " positions"),
            "shorten the prompt");
  std::vector<int64_t> ids(prompt.begin(), prompt.end()), pos(static_cast<size_t>(T));
  std::iota(pos.begin(), pos.end(), int64_t{0});
  Tensor h = run_layers(embed(ids, pos), {b}, pos, true);
  len_[static_cast<size_t>(b)] = T;
  return head_logits(h.slice(0, T - 1, T));
}

std::vector<float> KVCacheDecoder::step(const std::vector<int64_t>& rows, const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(rows.size());
  MPT_CHECK(n >= 1 && tokens.size() == rows.size(), str("step: ", rows.size(), " rows but ", tokens.size(), " tokens"), "");
  std::vector<int64_t> ids(tokens.begin(), tokens.end()), pos;
  std::vector<bool> seen(static_cast<size_t>(batch_), false);
  for (int64_t b : rows) {
    MPT_CHECK(b >= 0 && b < batch_ && !seen[static_cast<size_t>(b)], str("step: row ", b, " invalid or repeated"), "");
    seen[static_cast<size_t>(b)] = true;
    const int64_t p = len_[static_cast<size_t>(b)];
    MPT_CHECK(p >= 1, str("step: sequence ", b, " was not prefilled"), "call prefill first");
    MPT_CHECK(p < tmax_, str("step: sequence ", b, " already holds ", p, " tokens, the KV cache's capacity"), "");
    pos.push_back(p);
  }
  Tensor h = run_layers(embed(ids, pos), rows, pos, false);
  for (int64_t b : rows) ++len_[static_cast<size_t>(b)];
  return head_logits(h);
}

// The attention of a decode step: each new row's k/v are appended to its
// sequence's cache at its position, then its query heads attend over the cache.
class KVCacheDecoder::DecodeCore final : public AttentionCore {
 public:
  DecodeCore(KVCacheDecoder& d, int64_t layer, const std::vector<int64_t>& rows, const std::vector<int64_t>& pos)
      : d_(d), layer_(layer), rows_(rows), pos_(pos) {}
  void attend(const BlockShape& s, const Tensor& qkv, const Tensor& att) const override {
    const int64_t NH = s.heads, G = s.kv_groups(), HD = s.head_dim();
    const Tensor q3 = qkv.view({qkv.dim(0), NH + 2 * G, HD});
    const size_t l = static_cast<size_t>(layer_);
    for (size_t i = 0; i < rows_.size(); ++i) {
      const int64_t b = rows_[i], t = pos_[i];
      const Tensor row = q3.select(0, static_cast<int64_t>(i));  // (NH + 2G, HD)
      d_.k_cache_[l].select(0, b).select(1, t).copy_from(row.slice(0, NH, NH + G));
      d_.v_cache_[l].select(0, b).select(1, t).copy_from(row.slice(0, NH + G, NH + 2 * G));
    }
    d_.cached_attention(s, qkv, att, layer_, rows_, pos_);
  }
  const std::vector<int64_t>* positions() const override { return &pos_; }

 private:
  KVCacheDecoder& d_;
  int64_t layer_;
  const std::vector<int64_t>& rows_;
  const std::vector<int64_t>& pos_;
};

Tensor KVCacheDecoder::run_layers(Tensor x, const std::vector<int64_t>& rows, const std::vector<int64_t>& pos,
                                  bool prefill) {
  const GPTConfig& c = model_.config();
  const int64_t n = x.dim(0), NH = c.num_attention_heads, G = c.query_groups(), HD = c.head_dim();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    // Prefill: one sequence (batch 1, T = n) through the training block's causal
    // attention; a step: n sequences of one new token each, with the cache.
    const BlockShape s = block_shape(c, prefill ? 1 : n, prefill ? n : 1, TensorParallel{}, false, l);
    const DecodeCore core(*this, l, rows, pos);
    BlockActs acts;
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    block_forward(s, model_.block_params(l), x, y, acts, 0, 0, prefill ? nullptr : &core);
    if (prefill) {  // the rotated keys and values of positions [0, n)
      const Tensor q3 = acts.attn.qkv.view({n, NH + 2 * G, HD});
      const size_t li = static_cast<size_t>(l);
      k_cache_[li].select(0, rows[0]).slice(1, 0, n).copy_from(q3.slice(1, NH, NH + G).transpose(0, 1));
      v_cache_[li].select(0, rows[0]).slice(1, 0, n).copy_from(q3.slice(1, NH + G, NH + 2 * G).transpose(0, 1));
    }
    x = y;
  }
  Tape tape;
  tape.set_recording(false);
  return final_norm(tape, c, TensorParallel{}, model_.params(), Var(x)).value();
}

void KVCacheDecoder::cached_attention(const BlockShape& s, const Tensor& qkv, const Tensor& att, int64_t layer,
                                      const std::vector<int64_t>& rows, const std::vector<int64_t>& pos) {
  const GPTConfig& c = model_.config();
  const int64_t n = qkv.dim(0), NH = c.num_attention_heads, G = c.query_groups(), HD = c.head_dim();
  const int64_t r = NH / G, QL = (NH + 2 * G) * HD, C = NH * HD;  // r query heads per group; C: att width
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const Tensor& kc = k_cache_[static_cast<size_t>(layer)];
  const Tensor& vc = v_cache_[static_cast<size_t>(layer)];
  if (!force_ops_ && model_.device().is_cpu() && qkv.dtype() == DType::F32) {
    // Direct loop: row i, head h attends over the (L, HD) block of its group's cache.
    const float* q = qkv.data<float>();
    const float* K = kc.data<float>();
    const float* V = vc.data<float>();
    float* o = att.data<float>();
    const int64_t tmax = tmax_;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < NH; ++h) {
        const int64_t b = rows[static_cast<size_t>(i)], p = pos[static_cast<size_t>(i)], g = h / r;
        const int64_t t0 = s.first_key(p), L = p + 1 - t0;  // keys t0 … p
        const float* qi = q + i * QL + h * HD;
        const float* kb = K + ((b * G + g) * tmax + t0) * HD;
        const float* vb = V + ((b * G + g) * tmax + t0) * HD;
        std::vector<float> sc(static_cast<size_t>(L));
        float mx = -INFINITY;
        for (int64_t t = 0; t < L; ++t) {
          float d = 0.0f;
          for (int64_t e = 0; e < HD; ++e) d += qi[e] * kb[t * HD + e];
          sc[static_cast<size_t>(t)] = d * scale;
          mx = std::max(mx, sc[static_cast<size_t>(t)]);
        }
        float sum = 0.0f;
        for (int64_t t = 0; t < L; ++t) sum += (sc[static_cast<size_t>(t)] = std::exp(sc[static_cast<size_t>(t)] - mx));
        float* oi = o + i * C + h * HD;
        for (int64_t e = 0; e < HD; ++e) oi[e] = 0.0f;
        for (int64_t t = 0; t < L; ++t) {
          const float w = sc[static_cast<size_t>(t)] / sum;
          for (int64_t e = 0; e < HD; ++e) oi[e] += w * vb[t * HD + e];
        }
      }
    return;
  }
  // Tensor ops only (any device / dtype): per row and group, the group's r query
  // heads (r, HD) against its cached keys (L, HD).
  const Tensor q3 = qkv.view({n, NH + 2 * G, HD});
  const Tensor o3 = att.view({n, NH, HD});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = rows[static_cast<size_t>(i)], p = pos[static_cast<size_t>(i)];
    const int64_t t0 = s.first_key(p), L = p + 1 - t0;  // keys t0 … p
    for (int64_t g = 0; g < G; ++g) {
      const Tensor k = kc.select(0, b).select(0, g).slice(0, t0, p + 1);  // (L, HD)
      const Tensor v = vc.select(0, b).select(0, g).slice(0, t0, p + 1);
      const Tensor qg = q3.select(0, i).slice(0, g * r, (g + 1) * r).contiguous();  // (r, HD)
      Tensor scores = Tensor::empty({r, L}, qkv.dtype(), qkv.device());
      gemm(qg, k.contiguous(), scores, GemmArgs{false, true, scale, 0.0f});
      Tensor probs = Tensor::empty({r, L}, qkv.dtype(), qkv.device());
      softmax_forward(scores, probs);
      Tensor og = Tensor::empty({r, HD}, qkv.dtype(), qkv.device());
      gemm(probs, v.contiguous(), og, GemmArgs{});
      o3.select(0, i).slice(0, g * r, (g + 1) * r).copy_from(og);
    }
  }
}

std::vector<float> KVCacheDecoder::head_logits(const Tensor& h) {
  const GPTConfig& c = model_.config();
  const int64_t n = h.dim(0), Vp = c.padded_vocab_size, V = c.vocab_size;
  Tape tape;
  tape.set_recording(false);
  const Tensor logits = output_logits(tape, TensorParallel{}, Var(h.contiguous()), model_.output_weight(), Var()).value();
  const std::vector<float> all = logits.to_floats();
  std::vector<float> out(static_cast<size_t>(n * V));
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(all.begin() + i * Vp, V, out.begin() + i * V);
  return out;
}

// ---------------------------------------------------------------------------
// Sampling

int32_t sample_token(const float* logits, int64_t n, const SamplingParams& p, uint64_t stream, uint64_t step,
                     float* logprob) {
  MPT_CHECK(n >= 1, "sample_token: empty logits", "");
  int32_t chosen = 0;
  if (p.is_greedy()) {
    for (int64_t i = 1; i < n; ++i)
      if (logits[i] > logits[chosen]) chosen = static_cast<int32_t>(i);
  } else {
    const double inv_t = 1.0 / static_cast<double>(p.temperature);
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    const auto desc = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    int64_t keep = n;
    if (p.top_k > 0 && p.top_k < n) {
      keep = p.top_k;
      std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), desc);
    } else {
      std::sort(idx.begin(), idx.end(), desc);
    }
    // Probabilities (unnormalised) of the kept candidates, in descending order.
    std::vector<double> w(static_cast<size_t>(keep));
    const double mx = static_cast<double>(logits[idx[0]]) * inv_t;
    double total = 0;
    for (int64_t i = 0; i < keep; ++i)
      total += (w[static_cast<size_t>(i)] = std::exp(static_cast<double>(logits[idx[static_cast<size_t>(i)]]) * inv_t - mx));
    if (p.top_p > 0.0f) {
      double cum = 0;
      int64_t k = 0;
      while (k < keep && (k == 0 || cum <= static_cast<double>(p.top_p))) cum += w[static_cast<size_t>(k++)] / total;
      keep = k;
      total = 0;
      for (int64_t i = 0; i < keep; ++i) total += w[static_cast<size_t>(i)];
    }
    const double u = static_cast<double>(philox_uniform(p.seed, stream, step)) * total;
    double cum = 0;
    chosen = idx[static_cast<size_t>(keep - 1)];
    for (int64_t i = 0; i < keep; ++i) {
      cum += w[static_cast<size_t>(i)];
      if (u < cum) {
        chosen = idx[static_cast<size_t>(i)];
        break;
      }
    }
  }
  if (logprob) {
    double mx = logits[0];
    for (int64_t i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(logits[i]) - mx);
    *logprob = static_cast<float>(static_cast<double>(logits[chosen]) - mx - std::log(s));
  }
  return chosen;
}

// ---------------------------------------------------------------------------
// Generation

GenerateOutput generate(GPT& model, const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& o) {
  o.sampling.validate();
  const GPTConfig& c = model.config();
  const int64_t B = static_cast<int64_t>(prompts.size()), P = c.max_position_embeddings, V = c.vocab_size;
  MPT_CHECK(o.max_new_tokens >= 0, str("max_new_tokens must be >= 0, got ", o.max_new_tokens), "");
  GenerateOutput out;
  out.tokens.resize(static_cast<size_t>(B));
  out.generated.resize(static_cast<size_t>(B));
  out.logprobs.resize(static_cast<size_t>(B));
  std::vector<int64_t> limit(static_cast<size_t>(B));  // total tokens sequence b may reach
  int64_t tmax = 1;
  for (int64_t b = 0; b < B; ++b) {
    auto& ctx = out.tokens[static_cast<size_t>(b)];
    ctx = prompts[static_cast<size_t>(b)].empty() ? std::vector<int32_t>{o.eod} : prompts[static_cast<size_t>(b)];
    const int64_t T = static_cast<int64_t>(ctx.size());
    for (int32_t t : ctx)
      MPT_CHECK(t >= 0 && t < V, str("prompt ", b, " holds token id ", t, " outside the vocabulary [0, ", V, ")"), "");
    MPT_CHECK(T < P || o.max_new_tokens == 0,
              str("prompt ", b, " has ", T, " tokens; the model's max_position_embeddings is ", P,
                  " and one position is needed per new token"),
              "shorten the prompt");
    out.prompt_lengths.push_back(T);
    limit[static_cast<size_t>(b)] = std::min(T + o.max_new_tokens, P);
    tmax = std::max(tmax, limit[static_cast<size_t>(b)]);
  }
  if (B == 0 || o.max_new_tokens == 0) return out;

  KVCacheDecoder dec(model, B, tmax, o.force_ops_attention);
  std::vector<bool> done(static_cast<size_t>(B), false);
  const auto take = [&](int64_t b, const float* logits) {
    auto& gen = out.generated[static_cast<size_t>(b)];
    float lp = 0;
    const int32_t tok = sample_token(logits, V, o.sampling, static_cast<uint64_t>(b), gen.size(), &lp);
    gen.push_back(tok);
    out.logprobs[static_cast<size_t>(b)].push_back(lp);
    out.tokens[static_cast<size_t>(b)].push_back(tok);
    const int64_t total = static_cast<int64_t>(out.tokens[static_cast<size_t>(b)].size());
    if ((o.stop_at_eod && tok == o.eod) || static_cast<int64_t>(gen.size()) >= o.max_new_tokens ||
        total >= limit[static_cast<size_t>(b)])
      done[static_cast<size_t>(b)] = true;
  };
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<float> logits = dec.prefill(b, out.tokens[static_cast<size_t>(b)]);
    take(b, logits.data());
  }
  for (;;) {
    std::vector<int64_t> rows;
    std::vector<int32_t> toks;
    for (int64_t b = 0; b < B; ++b)
      if (!done[static_cast<size_t>(b)]) {
        rows.push_back(b);
        toks.push_back(out.tokens[static_cast<size_t>(b)].back());
      }
    if (rows.empty()) break;
    const std::vector<float> logits = dec.step(rows, toks);
    for (size_t i = 0; i < rows.size(); ++i) take(rows[i], logits.data() + static_cast<int64_t>(i) * V);
  }
  return out;
}

std::vector<int32_t> generate_full_recompute(GPT& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                                             int32_t eod, bool stop_at_eod) {
  const GPTConfig& c = model.config();
  std::vector<int32_t> seq = prompt.empty() ? std::vector<int32_t>{eod} : prompt;
  std::vector<int32_t> gen;
  while (static_cast<int64_t>(gen.size()) < max_new_tokens &&
         static_cast<int64_t>(seq.size()) < c.max_position_embeddings) {
    const int64_t T = static_cast<int64_t>(seq.size());
    const Tensor logits = model.logits(Tensor::from_ints(std::vector<int64_t>(seq.begin(), seq.end()), {1, T}));
    const std::vector<float> last = logits.slice(0, T - 1, T).to_floats();
    SamplingParams greedy;
    greedy.greedy = true;
    const int32_t tok = sample_token(last.data(), c.vocab_size, greedy, 0, 0);
    gen.push_back(tok);
    seq.push_back(tok);
    if (stop_at_eod && tok == eod) break;
  }
  return gen;
}

}  // namespace mpitron
