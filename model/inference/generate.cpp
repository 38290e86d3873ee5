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
// Decoding sessions over the paged cache

namespace {
constexpr int64_t kBlockSize = 16;
int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
}  // namespace

DecodeSession::DecodeSession(const GPT& model, int64_t batch, int64_t max_len, bool force_ops_attention)
    : model_(model), batch_(batch), tmax_(max_len), force_ops_(force_ops_attention) {
  const GPTConfig& c = model.config();
  const ModelParallel& mp = model.parallel();
  MPT_CHECK(mp.tp.size == 1 && mp.pp_size == 1 && mp.cp.size == 1, "a DecodeSession needs the whole model on one rank",
            "load the checkpoint into a single process (it loads under any layout), or serve it with the ModelRunner");
  MPT_CHECK(batch >= 1, str("generation batch must be >= 1, got ", batch), "");
  MPT_CHECK(max_len >= 1 && max_len <= c.max_position_embeddings,
            str("KV cache length ", max_len, " must be in [1, max_position_embeddings = ", c.max_position_embeddings, "]"),
            "ask for fewer tokens");
  len_.assign(static_cast<size_t>(batch), 0);
  const int64_t per_seq = (max_len + kBlockSize - 1) / kBlockSize;
  kv_ = std::make_unique<PagedKVCache>(c.num_layers, kv_layout(c, 1), kBlockSize, batch * per_seq, c.compute_dtype,
                                       model.device());
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int32_t> t(static_cast<size_t>(per_seq));
    std::iota(t.begin(), t.end(), static_cast<int32_t>(b * per_seq));
    tables_.push_back(std::move(t));
  }
}

DecodeSession::~DecodeSession() = default;

std::vector<float> DecodeSession::run(const std::vector<int32_t>& ids, const PagedRows& in_rows,
                                      const std::vector<int64_t>& wanted) {
  const GPTConfig& c = model_.config();
  const int64_t n = static_cast<int64_t>(ids.size()), npad = round_up(n, kRowTile), C = c.hidden_size;
  const int64_t Vp = c.padded_vocab_size, V = c.vocab_size;
  PagedRows rows = in_rows;  // padded to whole tiles with rows that write and read nothing
  rows.pos.resize(static_cast<size_t>(npad), -1);
  rows.seq.resize(static_cast<size_t>(npad), 0);
  std::vector<int64_t> all_ids(static_cast<size_t>(npad), 0), pos(static_cast<size_t>(npad), 0);
  for (int64_t i = 0; i < n; ++i) {
    all_ids[static_cast<size_t>(i)] = ids[static_cast<size_t>(i)];
    pos[static_cast<size_t>(i)] = rows.pos[static_cast<size_t>(i)];
  }
  Tape tape;
  tape.set_recording(false);
  EmbedRows er;
  er.ids = ids_tensor(all_ids, model_.device());
  er.positions = pos;
  const Tensor x = embed_tokens(tape, c, TensorParallel{}, model_.params(), er, 0.0f, 0).value();
  const Tensor hs = paged_layers(model_, 0, c.num_layers, x, rows, *kv_, TensorParallel{}, force_ops_);
  // The head on the rows asked for, one tile at a time (model/layers/model_ends.h's final norm and output layer).
  const int64_t nl = static_cast<int64_t>(wanted.size()), nlpad = round_up(nl, kHeadRowTile);
  Tensor h = Tensor::zeros({nlpad, C}, c.compute_dtype, model_.device());
  for (int64_t i = 0; i < nl; ++i) {
    const int64_t r = wanted[static_cast<size_t>(i)];
    h.slice(0, i, i + 1).copy_from(hs.slice(0, r, r + 1));
  }
  h = final_norm(tape, c, TensorParallel{}, model_.params(), Var(h)).value();
  std::vector<float> out(static_cast<size_t>(nl * V));
  for (int64_t t0 = 0; t0 < nl; t0 += kHeadRowTile) {
    const Tensor logits =
        lm_logits(tape, c, TensorParallel{}, Var(h.slice(0, t0, t0 + kHeadRowTile)), model_.output_weight()).value();
    const std::vector<float> f = logits.to_floats();
    for (int64_t i = t0; i < std::min(nl, t0 + kHeadRowTile); ++i)
      std::copy_n(f.begin() + (i - t0) * Vp, V, out.begin() + i * V);
  }
  return out;
}

std::vector<float> DecodeSession::prefill(int64_t b, const std::vector<int32_t>& prompt) {
  const int64_t T = static_cast<int64_t>(prompt.size());
  MPT_CHECK(b >= 0 && b < batch_, str("sequence ", b, " outside the batch of ", batch_), "");
  MPT_CHECK(T >= 1 && T <= tmax_, str("prompt of ", T, " tokens does not fit the KV cache of ", tmax_, " positions"),
            "shorten the prompt");
  PagedRows rows;
  rows.tables = {tables_[static_cast<size_t>(b)]};
  for (int64_t t = 0; t < T; ++t) rows.pos.push_back(t), rows.seq.push_back(0);
  std::vector<float> l = run(prompt, rows, {T - 1});
  len_[static_cast<size_t>(b)] = T;
  return l;
}

std::vector<float> DecodeSession::step(const std::vector<int64_t>& seqs, const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(seqs.size());
  MPT_CHECK(n >= 1 && tokens.size() == seqs.size(), str("step: ", seqs.size(), " rows but ", tokens.size(), " tokens"), "");
  std::vector<bool> seen(static_cast<size_t>(batch_), false);
  PagedRows rows;
  std::vector<int64_t> wanted;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = seqs[static_cast<size_t>(i)];
    MPT_CHECK(b >= 0 && b < batch_ && !seen[static_cast<size_t>(b)], str("step: row ", b, " invalid or repeated"), "");
    seen[static_cast<size_t>(b)] = true;
    const int64_t p = len_[static_cast<size_t>(b)];
    MPT_CHECK(p >= 1, str("step: sequence ", b, " was not prefilled"), "call prefill first");
    MPT_CHECK(p < tmax_, str("step: sequence ", b, " already holds ", p, " tokens, the KV cache's capacity"), "");
    rows.pos.push_back(p);
    rows.seq.push_back(static_cast<int32_t>(i));
    rows.tables.push_back(tables_[static_cast<size_t>(b)]);
    wanted.push_back(i);
  }
  std::vector<float> l = run(tokens, rows, wanted);
  for (int64_t b : seqs) ++len_[static_cast<size_t>(b)];
  return l;
}

// ---------------------------------------------------------------------------
// Sampling

TopLogprobs top_logprobs(const float* row, int64_t V, int64_t n) {
  double mx = row[0];
  for (int64_t j = 1; j < V; ++j) mx = std::max(mx, static_cast<double>(row[j]));
  double sum = 0;
  for (int64_t j = 0; j < V; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
  const double lse = mx + std::log(sum);
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                    [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  TopLogprobs top;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t t = idx[static_cast<size_t>(j)];
    top.emplace_back(t, static_cast<float>(row[t] - lse));
  }
  return top;
}

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

  DecodeSession dec(model, B, tmax, o.force_ops_attention);
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
