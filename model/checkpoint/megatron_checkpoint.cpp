#include "model/checkpoint/megatron_checkpoint.h"
#include "model/checkpoint/megatron_names.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <map>
#include <memory>

#include "core/log.h"
#include "core/timer.h"
#include "io/checkpoint.h"
#include "io/torch_checkpoint.h"
#include "io/torch_dist.h"
#include "model/arch_fields.h"
#include "model/param_table.h"
#include "parallel/job_exit.h"

namespace mpitron {

namespace fs = std::filesystem;

const char* to_string(MegatronFormat f) {
  switch (f) {
    case MegatronFormat::Torch: return "torch";
    case MegatronFormat::TorchDist: return "torch_dist";
    default: return "none";
  }
}

// ---- the directory --------------------------------------------------------------------------

MegatronDir detect_megatron_checkpoint(const std::string& load_dir, const std::string& want) {
  MegatronDir d;
  d.root = load_dir;
  const fs::path root(load_dir);
  std::error_code ec;
  if (fs::exists(root / "latest", ec) && !fs::exists(root / io::kTrackerFileName, ec)) {
    MPT_THROW(str("--load ", load_dir,
                  " is a DeepSpeed / Megatron-DeepSpeed checkpoint ('latest' + global_stepN/): resuming those is not "
                  "built yet"),
              "convert its weights with DeepSpeed's zero_to_fp32.py and Hugging Face's save_pretrained, then "
              "convert_checkpoint --direction hf-to-mpitron (the optimizer state is not carried)");
  }
  std::ifstream in(root / io::kTrackerFileName);
  if (!in) return d;
  std::string text;
  in >> text;
  std::string iter_name;
  if (text == "release") {
    iter_name = "release";
  } else {
    try {
      size_t used = 0;
      d.iteration = std::stoll(text, &used);
      MPT_CHECK(used == text.size() && d.iteration >= 0, "", "");
    } catch (...) {
      return d;  // not Megatron's tracker: mpitron's reader says what is wrong with it
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "iter_%07lld", static_cast<long long>(d.iteration));
    iter_name = buf;
  }
  const fs::path it = root / iter_name;
  if (!fs::is_directory(it, ec)) return d;
  // mpitron's own checkpoint, also when pretrain_gpt --ckpt-format torch wrote Megatron's files beside it
  if (fs::exists(it / io::kCheckpointFileName, ec)) return d;
  if (fs::exists(it / "metadata.json", ec) || fs::exists(it / ".metadata", ec)) {
    d.format = MegatronFormat::TorchDist;
  } else {
    for (const auto& e : fs::directory_iterator(it, ec))
      if (e.path().filename().string().rfind("mp_rank_", 0) == 0) d.format = MegatronFormat::Torch;
  }
  if (d.format == MegatronFormat::None) return d;  // mpitron's own (--ckpt-format then only names what Megatron saves)
  if (d.format == MegatronFormat::TorchDist && fs::exists(it / "metadata.json", ec)) {
    std::ifstream mj(it / "metadata.json");
    const nlohmann::json j = nlohmann::json::parse(mj, nullptr, false);
    MPT_CHECK(!j.is_object() || j.value("sharded_backend", "torch_dist") == "torch_dist",
              str(it.string(), "/metadata.json names the ", j.value("sharded_backend", ""), " backend"),
              "only torch_dist is read: re-save with Megatron-LM's --ckpt-format torch_dist (or --ckpt-convert-format)");
  }
  MPT_CHECK(want.empty() || want == to_string(d.format),
            str("--ckpt-format ", want, " but ", it.string(), " is in Megatron's ", to_string(d.format), " format"),
            str("pass --ckpt-format ", to_string(d.format), " or leave it out (the format is detected)"));
  d.iter_dir = it.string();
  return d;
}

// ---- args ------------------------------------------------------------------------------------

namespace {

const io::PyValue* arg(const io::PyValue& args, const char* name) {
  const io::PyValue* v = args.attr(name);
  return v && !v->is_none() ? v : nullptr;
}
int64_t arg_int(const io::PyValue& a, const char* name, int64_t dflt) {
  const io::PyValue* v = arg(a, name);
  return v ? v->as_int() : dflt;
}
bool arg_bool(const io::PyValue& a, const char* name, bool dflt) {
  const io::PyValue* v = arg(a, name);
  return v ? v->as_bool() : dflt;
}
double arg_float(const io::PyValue& a, const char* name, double dflt) {
  const io::PyValue* v = arg(a, name);
  return v ? v->as_float() : dflt;
}
std::string arg_str(const io::PyValue& a, const char* name, const std::string& dflt) {
  const io::PyValue* v = arg(a, name);
  return v ? v->as_str() : dflt;
}

std::string mp_dir(int64_t tp, int64_t pp, int64_t pp_size) {
  char buf[40];
  if (pp_size == 1) std::snprintf(buf, sizeof buf, "mp_rank_%02lld", static_cast<long long>(tp));
  else std::snprintf(buf, sizeof buf, "mp_rank_%02lld_%03lld", static_cast<long long>(tp), static_cast<long long>(pp));
  return buf;
}

// The file holding 'args', 'iteration', 'opt_param_scheduler': torch_dist's common.pt, or the
// legacy format's first model-parallel rank's model_optim_rng.pt.
io::TorchFile open_common(const MegatronDir& d) {
  if (d.format == MegatronFormat::TorchDist) {
    const fs::path p = fs::path(d.iter_dir) / "common.pt";
    MPT_CHECK(fs::exists(p), str(d.iter_dir, " has no common.pt"), "the torch_dist checkpoint is incomplete");
    return io::TorchFile::open(p.string());
  }
  for (const char* first : {"mp_rank_00", "mp_rank_00_000"}) {
    const fs::path p = fs::path(d.iter_dir) / first / "model_optim_rng.pt";
    if (fs::exists(p)) return io::TorchFile::open(p.string());
  }
  MPT_THROW(str(d.iter_dir, " has neither mp_rank_00/ nor mp_rank_00_000/model_optim_rng.pt"),
            "the legacy checkpoint is incomplete (an expert-parallel layout mp_rank_TT_PPP_EEE is not read)");
}

const io::PyValue& args_of(const io::TorchFile& f) {
  const io::PyValue* a = f.root().get("args");
  MPT_CHECK(a && a->is(io::PyKind::Object), str(f.label(), " has no 'args' (argparse.Namespace)"),
            "was it saved by Megatron-LM's save_checkpoint? (megatron-core alone saves no args)");
  return *a;
}

void refuse_arg(const io::PyValue& a, const char* name, const std::string& hint) {
  const io::PyValue* v = arg(a, name);
  const bool on = v && ((v->is(io::PyKind::Bool) && v->as_bool()) || (v->is(io::PyKind::Int) && v->as_int() != 0) ||
                        v->is(io::PyKind::Str) || v->is(io::PyKind::List) || v->is(io::PyKind::Tuple));
  MPT_CHECK(!on, str("the Megatron checkpoint's args set ", name, " = ", v ? v->describe() : "", ": not loaded by mpitron"),
            hint);
}

GPTConfig config_of_args(const io::PyValue& a, const std::string& where) {
  refuse_arg(a, "num_experts", "MoE checkpoints from Megatron are not read yet (only dense GPT / Llama)");
  refuse_arg(a, "multi_latent_attention", "MLA checkpoints from Megatron are not read yet");
  refuse_arg(a, "qk_layernorm", "QK-norm checkpoints from Megatron are not read yet");
  refuse_arg(a, "squared_relu", "mpitron has no squared-ReLU MLP");
  refuse_arg(a, "rotary_interleaved", "mpitron's rope rotates halves, not interleaved pairs");
  refuse_arg(a, "use_rope_scaling", "convert through Hugging Face (rope scaling is read from config.json)");
  refuse_arg(a, "num_layers_per_virtual_pipeline_stage", "re-save without virtual pipeline stages");
  refuse_arg(a, "decoder_first_pipeline_num_layers", "re-save with an even pipeline split");
  refuse_arg(a, "decoder_last_pipeline_num_layers", "re-save with an even pipeline split");
  GPTConfig c;
  auto need = [&](const char* name) {
    const io::PyValue* v = arg(a, name);
    MPT_CHECK(v, str(where, ": args has no ", name), "was it saved by Megatron-LM's pretrain_gpt?");
    return v->as_int();
  };
  c.num_layers = need("num_layers");
  c.hidden_size = need("hidden_size");
  c.num_attention_heads = need("num_attention_heads");
  const int64_t hd = arg_int(a, "kv_channels", 0);
  c.kv_channels = hd > 0 && hd * c.num_attention_heads != c.hidden_size ? hd : 0;
  if (arg_bool(a, "group_query_attention", false)) {
    const int64_t g = arg_int(a, "num_query_groups", c.num_attention_heads);
    c.num_query_groups = g == c.num_attention_heads ? 0 : g;
  }
  const int64_t f = arg_int(a, "ffn_hidden_size", 4 * c.hidden_size);
  c.ffn_hidden_size = f;
  c.seq_length = need("seq_length");
  c.max_position_embeddings = arg_int(a, "max_position_embeddings", c.seq_length);
  c.padded_vocab_size = need("padded_vocab_size");
  c.vocab_size = arg_int(a, "vocab_size", c.padded_vocab_size);
  const std::string norm = arg_str(a, "normalization", "LayerNorm");
  MPT_CHECK(norm == "LayerNorm" || norm == "RMSNorm", str(where, ": normalization ", norm, " is not one mpitron has"), "");
  c.normalization = norm == "RMSNorm" ? Normalization::RMSNorm : Normalization::LayerNorm;
  c.layernorm_epsilon = static_cast<float>(arg_float(a, "norm_epsilon", arg_float(a, "layernorm_epsilon", 1e-5)));
  c.layernorm_1p = arg_bool(a, "apply_layernorm_1p", false);
  // Megatron-LM's GELU: the tanh approximation when fused with a bias (bias_gelu_fusion, its
  // default) or --openai-gelu; F.gelu (erf) otherwise.
  c.add_bias_linear = arg_bool(a, "add_bias_linear", true);
  c.add_qkv_bias = arg_bool(a, "add_qkv_bias", c.add_bias_linear);
  if (c.add_qkv_bias == c.add_bias_linear) c.add_qkv_bias = false;  // mpitron: the qkv bias beyond add_bias_linear
  if (arg_bool(a, "swiglu", false)) c.mlp = MlpKind::SwiGLU;
  else if (arg_bool(a, "openai_gelu", false) || (arg_bool(a, "bias_gelu_fusion", true) && c.add_bias_linear))
    c.mlp = MlpKind::GeluTanh;
  else c.mlp = MlpKind::GeluErf;
  const std::string pos = arg_str(a, "position_embedding_type", "learned_absolute");
  if (pos == "learned_absolute") c.position_embedding = PositionEmbedding::Learned;
  else if (pos == "rope") c.position_embedding = PositionEmbedding::Rope;
  else if (pos == "none") c.position_embedding = PositionEmbedding::None;
  else MPT_THROW(str(where, ": position_embedding_type ", pos, " is not one mpitron reads from Megatron"), "");
  c.rotary_base = arg_float(a, "rotary_base", 10000.0);
  c.rotary_percent = arg_float(a, "rotary_percent", 1.0);
  c.untie_embeddings = arg_bool(a, "untie_embeddings_and_output_weights", false);
  c.hidden_dropout = static_cast<float>(arg_float(a, "hidden_dropout", 0.1));
  c.attention_dropout = static_cast<float>(arg_float(a, "attention_dropout", 0.1));
  c.init_method_std = static_cast<float>(arg_float(a, "init_method_std", 0.02));
  c.validate();
  return c;
}

struct MegatronRun {
  MegatronDir dir;
  io::TorchFile common;
  GPTConfig cfg;
  MegatronLayoutArgs layout;
  int64_t num_layers = 0;
  std::vector<int64_t> stage_first;  // first global layer of each writer pipeline stage (+ the end)
};

MegatronRun open_run(const MegatronDir& d) {
  MegatronRun r{d, open_common(d), {}, {}, 0, {}};
  const io::PyValue& a = args_of(r.common);
  r.cfg = config_of_args(a, r.common.label());
  r.layout.tp = arg_int(a, "tensor_model_parallel_size", 1);
  r.layout.pp = arg_int(a, "pipeline_model_parallel_size", 1);
  r.layout.dp = arg_int(a, "data_parallel_size", 1);
  r.layout.te_names = arg_str(a, "transformer_impl", "transformer_engine") == "transformer_engine";
  if (arg_bool(a, "overlap_grad_reduce", false)) {
    const int64_t bs = arg_int(a, "ddp_bucket_size", 0);
    r.layout.bucket_size = bs > 0 ? bs : std::max<int64_t>(40000000, 1000000 * r.layout.dp);
  }
  MPT_CHECK(r.cfg.num_layers % r.layout.pp == 0,
            str(r.common.label(), ": ", r.cfg.num_layers, " layers over ", r.layout.pp, " pipeline stages"),
            "only an even pipeline split is read");
  const int64_t per = r.cfg.num_layers / r.layout.pp;
  for (int64_t p = 0; p <= r.layout.pp; ++p) r.stage_first.push_back(p * per);
  return r;
}

}  // namespace

GPTConfig megatron_config_of_args(const io::PyValue& args, const std::string& where) {
  return config_of_args(args, where);
}

GPTConfig megatron_config(const std::string& load_dir) {
  const MegatronDir d = detect_megatron_checkpoint(load_dir);
  MPT_CHECK(d.format != MegatronFormat::None, str(load_dir, " is not a Megatron checkpoint directory"), "");
  return open_run(d).cfg;
}

// ---- names (model/checkpoint/megatron_names.h) -----------------------------------------------

MegTensor megatron_of(const ParamSpec& s, const GPTConfig& c) {
  MegTensor t;
  t.layer = s.place == ParamPlace::Layer ? s.layer : -1;
  switch (s.role) {
    case ParamRole::WordEmbedding: t.name = "embedding.word_embeddings.weight", t.tp_axis = 0; break;
    case ParamRole::PositionEmbedding: t.name = "embedding.position_embeddings.weight"; break;
    case ParamRole::Norm1Weight:
      t.name = "self_attention.linear_qkv.layer_norm_weight", t.local_name = "input_layernorm.weight";
      break;
    case ParamRole::Norm1Bias:
      t.name = "self_attention.linear_qkv.layer_norm_bias", t.local_name = "input_layernorm.bias";
      break;
    case ParamRole::QkvWeight: t.name = "self_attention.linear_qkv.weight", t.tp_axis = 0, t.qkv = true; break;
    case ParamRole::QkvBias: t.name = "self_attention.linear_qkv.bias", t.tp_axis = 0, t.qkv = true; break;
    case ParamRole::ProjWeight: t.name = "self_attention.linear_proj.weight", t.tp_axis = 1; break;
    case ParamRole::ProjBias: t.name = "self_attention.linear_proj.bias"; break;
    case ParamRole::Norm2Weight:
      t.name = "mlp.linear_fc1.layer_norm_weight", t.local_name = "pre_mlp_layernorm.weight";
      break;
    case ParamRole::Norm2Bias: t.name = "mlp.linear_fc1.layer_norm_bias", t.local_name = "pre_mlp_layernorm.bias"; break;
    case ParamRole::FcWeight:
    case ParamRole::FcBias:
      t.name = s.role == ParamRole::FcWeight ? "mlp.linear_fc1.weight" : "mlp.linear_fc1.bias";
      t.tp_axis = 0;
      if (c.fc_rows() != c.ffn()) t.parts = {c.ffn(), c.ffn()};
      break;
    case ParamRole::MlpProjWeight: t.name = "mlp.linear_fc2.weight", t.tp_axis = 1; break;
    case ParamRole::MlpProjBias: t.name = "mlp.linear_fc2.bias"; break;
    case ParamRole::FinalNormWeight: t.name = "decoder.final_layernorm.weight"; break;
    case ParamRole::FinalNormBias: t.name = "decoder.final_layernorm.bias"; break;
    case ParamRole::OutputWeight: t.name = "output_layer.weight", t.tp_axis = 0; break;
    default:
      MPT_THROW(str("mpitron's ", s.name, " (", to_string(s.role), ") has no Megatron GPTModel counterpart that is read"),
                "only dense GPT-2 / Llama-style GPTModel checkpoints are loaded from Megatron");
  }
  return t;
}

// Megatron's row of mpitron's qkv row r (Q | K | V → per group [q_g; k_g; v_g]).
int64_t megatron_qkv_row(const GPTConfig& c, int64_t r) {
  const int64_t nh = c.num_attention_heads, g = c.query_groups(), hd = c.head_dim(), per = nh / g;
  const int64_t block = (per + 2) * hd;
  if (r < nh * hd) {
    const int64_t h = r / hd, d = r % hd;
    return (h / per) * block + (h % per) * hd + d;
  }
  r -= nh * hd;
  if (r < g * hd) return (r / hd) * block + per * hd + r % hd;
  r -= g * hd;
  return (r / hd) * block + (per + 1) * hd + r % hd;
}

namespace {

// One TP shard's part of a window of a Megatron tensor: rows [row, row + rows) × columns
// [col, col + cols) of shard `tp`'s local tensor (a 1-D tensor: one column), landing at
// (dst_row, dst_col) of the window.
struct ShardRect {
  int64_t tp, row, col, rows, cols, dst_row, dst_col;
};

// The shard rectangles that make rows [r0, r0 + nr) × columns [c0, c0 + nc) of the global tensor t
// (shape g) as Megatron's tp ranks hold it: rows split part by part (SwiGLU's [gate_t; up_t]),
// columns split evenly, or replicated (tensor rank 0's copy).
std::vector<ShardRect> shard_rects(const MegTensor& t, const Shape& g, int64_t tp, int64_t r0, int64_t nr, int64_t c0,
                                   int64_t nc) {
  std::vector<ShardRect> out;
  if (t.tp_axis < 0 || tp == 1) {
    out.push_back({0, r0, c0, nr, nc, 0, 0});
  } else if (t.tp_axis == 1) {
    const int64_t w = g[1] / tp;
    for (int64_t col = c0; col < c0 + nc;) {
      const int64_t lc = col % w, n = std::min(c0 + nc - col, w - lc);
      out.push_back({col / w, r0, lc, nr, n, 0, col - c0});
      col += n;
    }
  } else {
    const std::vector<int64_t> parts = t.parts.empty() ? std::vector<int64_t>{g[0]} : t.parts;
    for (int64_t r = r0; r < r0 + nr;) {
      int64_t start = 0, local_start = 0;
      size_t k = 0;
      while (k + 1 < parts.size() && r >= start + parts[k]) start += parts[k], local_start += parts[k] / tp, ++k;
      const int64_t per = parts[k] / tp, i = r - start, n = std::min(r0 + nr - r, per - i % per);
      out.push_back({i / per, local_start + i % per, c0, n, nc, r - r0, 0});
      r += n;
    }
  }
  return out;
}

// Copies a rows × cols block into dst (row stride `stride`) at (row, col).
void place(const float* src, int64_t rows, int64_t cols, float* dst, int64_t stride, int64_t row, int64_t col) {
  for (int64_t i = 0; i < rows; ++i) std::copy_n(src + i * cols, cols, dst + (row + i) * stride + col);
}

// The TP-local shape of a global one.
Shape local_shape(Shape g, const MegTensor& t, int64_t tp) {
  if (t.tp_axis >= 0) g[static_cast<size_t>(t.tp_axis)] /= tp;
  return g;
}

}  // namespace

// ---- the flat buffer -------------------------------------------------------------------------

MegatronBufferLayout megatron_buffer_layout(const GPTConfig& c, const MegatronLayoutArgs& a, int64_t pp_rank) {
  // The stage's parameters in GPTModel's registration order (named_parameters()).
  struct P {
    std::string name;
    Shape shape;
    bool shared = false;
  };
  std::vector<P> params;
  const bool first = pp_rank == 0, last = pp_rank == a.pp - 1;
  const int64_t per = c.num_layers / a.pp, l0 = pp_rank * per;
  std::map<std::string, ParamSpec> by_name;
  const std::vector<ParamSpec> table = param_table(c);
  auto add = [&](const ParamSpec& s, int64_t local_layer, bool shared = false) {
    const MegTensor t = megatron_of(s, c);
    params.push_back({a.te_names ? t.full(local_layer) : t.full_local(local_layer), local_shape(s.global_shape, t, a.tp),
                      shared});
  };
  const bool pipelined_tied = a.pp > 1 && c.tied_output();
  for (const ParamSpec& s : table)
    if (first && (s.role == ParamRole::WordEmbedding || s.role == ParamRole::PositionEmbedding))
      add(s, -1, s.role == ParamRole::WordEmbedding && pipelined_tied);
  // Within a block: GPTModel registers the norm before attention (local spec), the projection
  // before qkv (SelfAttention builds linear_proj in Attention.__init__), TE's fused norm inside
  // linear_qkv / linear_fc1 before their weight.
  const std::vector<ParamRole> local_order = {ParamRole::Norm1Weight,  ParamRole::Norm1Bias,   ParamRole::ProjWeight,
                                              ParamRole::ProjBias,     ParamRole::QkvWeight,   ParamRole::QkvBias,
                                              ParamRole::Norm2Weight,  ParamRole::Norm2Bias,   ParamRole::FcWeight,
                                              ParamRole::FcBias,       ParamRole::MlpProjWeight, ParamRole::MlpProjBias};
  const std::vector<ParamRole> te_order = {ParamRole::ProjWeight,  ParamRole::ProjBias,  ParamRole::Norm1Weight,
                                           ParamRole::Norm1Bias,   ParamRole::QkvWeight, ParamRole::QkvBias,
                                           ParamRole::Norm2Weight, ParamRole::Norm2Bias, ParamRole::FcWeight,
                                           ParamRole::FcBias,      ParamRole::MlpProjWeight, ParamRole::MlpProjBias};
  for (int64_t l = l0; l < l0 + per; ++l) {
    const std::vector<ParamSpec> rows = block_param_table(c, l);
    for (const ParamRole role : a.te_names ? te_order : local_order)
      for (const ParamSpec& s : rows)
        if (s.role == role) add(s, l - l0);
    for (const ParamSpec& s : rows) {
      const bool known = std::find(local_order.begin(), local_order.end(), s.role) != local_order.end();
      MPT_CHECK(known, str("mpitron's ", s.name, " (", to_string(s.role), ") has no Megatron counterpart that is read"),
                "only dense GPT-2 / Llama-style GPTModel checkpoints are loaded from Megatron");
    }
  }
  if (last) {
    for (const ParamSpec& s : table)
      if (s.role == ParamRole::FinalNormWeight || s.role == ParamRole::FinalNormBias) add(s, -1);
    for (const ParamSpec& s : table) {
      if (s.role == ParamRole::OutputWeight) add(s, -1);
      if (s.role == ParamRole::WordEmbedding && pipelined_tied) {  // the last stage's output_layer copy
        P p{"output_layer.weight", local_shape(s.global_shape, megatron_of(s, c), a.tp), true};
        params.push_back(p);
      }
    }
  }
  // _ParamAndGradBuffer: reverse order, starts padded to 64, bucket ends to lcm(dp, 128).
  auto pad = [](int64_t n, int64_t d) { return (n + d - 1) / d * d; };
  const int64_t bucket_div = std::lcm(a.dp, int64_t{128});
  MegatronBufferLayout out;
  int64_t start = 0, bucket_start = 0, bucket = 0, nparams = 0, end = 0;
  auto close_bucket = [&](int64_t param_end) {
    out.bucket_numel_unpadded.push_back(param_end - bucket_start);
    const int64_t e = pad(param_end, bucket_div);
    bucket_start = e;
    nparams = 0;
    ++bucket;
    return e;
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    start = pad(start, 64);
    if (it->shared && nparams > 0) start = close_bucket(start);
    end = start + shape_numel(it->shape);
    out.entries.push_back({it->name, it->shape, bucket, start - bucket_start});
    ++nparams;
    if ((a.bucket_size > 0 && end - bucket_start >= a.bucket_size) || it->shared) start = close_bucket(end);
    else start = end;
  }
  if (nparams > 0) close_bucket(end);
  return out;
}

// ---- reading ---------------------------------------------------------------------------------

namespace {

// Windows of Megatron's global tensors, f32: the model's weights and the distributed optimizer's
// states. A window reads only the shards' bytes it covers.
class MegatronSource {
 public:
  explicit MegatronSource(const MegatronRun& run) : run_(run) {}
  virtual ~MegatronSource() = default;
  // Rows [r0, r0 + nr) × columns [c0, c0 + nc) of t (global shape g; 1-D: one column), row-major in
  // dst. key "": the model weights; "param" (fp32 master weights), "exp_avg", "exp_avg_sq": the
  // distributed optimizer's.
  void read(const MegTensor& t, const Shape& g, const std::string& key, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
            float* dst) {
    if (key.empty()) return model(t, g, r0, nr, c0, nc, dst);
    const int64_t pp = stage_of(t);
    const MegatronBufferLayout& lay = layout(pp);
    const int64_t local_layer = t.layer < 0 ? -1 : t.layer - run_.stage_first[static_cast<size_t>(pp)];
    const std::string a = t.full(local_layer), b = t.full_local(local_layer);
    const MegatronBufferEntry* e = nullptr;
    for (const MegatronBufferEntry& x : lay.entries)
      if (x.name == a || x.name == b) e = &x;
    MPT_CHECK(e, str("internal: ", a, " is not in pipeline stage ", pp, "'s grad buffer"), "");
    const int64_t lcols = e->shape.size() == 2 ? e->shape[1] : 1;
    std::vector<float> tmp;
    for (const ShardRect& sr : shard_rects(t, g, run_.layout.tp, r0, nr, c0, nc)) {
      tmp.resize(static_cast<size_t>(sr.rows * sr.cols));
      if (sr.cols == lcols) {  // whole rows: one run of the flat buffer
        flat(sr.tp, pp, e->bucket, e->start + sr.row * lcols, key, tmp.data(), sr.rows * lcols);
      } else {
        for (int64_t i = 0; i < sr.rows; ++i)
          flat(sr.tp, pp, e->bucket, e->start + (sr.row + i) * lcols + sr.col, key, tmp.data() + i * sr.cols, sr.cols);
      }
      place(tmp.data(), sr.rows, sr.cols, dst, nc, sr.dst_row, sr.dst_col);
    }
  }
  // Bytes read from the checkpoint's files so far (open and read).
  virtual uint64_t bytes_read() const = 0;
  // The pipeline stage of the writer holding t.
  int64_t stage_of(const MegTensor& t) const {
    if (t.layer >= 0) {
      for (int64_t p = 0; p < run_.layout.pp; ++p)
        if (t.layer < run_.stage_first[static_cast<size_t>(p) + 1]) return p;
      MPT_THROW(str("internal: layer ", t.layer, " past the last stage"), "");
    }
    return t.name.rfind("embedding.", 0) == 0 ? 0 : run_.layout.pp - 1;
  }

 protected:
  virtual void model(const MegTensor& t, const Shape& g, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                     float* dst) = 0;
  const MegatronBufferLayout& layout(int64_t pp) {
    auto it = layouts_.find(pp);
    if (it == layouts_.end()) it = layouts_.emplace(pp, megatron_buffer_layout(run_.cfg, run_.layout, pp)).first;
    return it->second;
  }
  // Elements [start, start + n) of bucket `bucket`'s flat `key` of model-parallel rank (tp, pp).
  virtual void flat(int64_t tp, int64_t pp, int64_t bucket, int64_t start, const std::string& key, float* dst,
                    int64_t n) = 0;
  const MegatronRun& run_;
  std::map<int64_t, MegatronBufferLayout> layouts_;
};

class LegacySource : public MegatronSource {
 public:
  explicit LegacySource(const MegatronRun& run) : MegatronSource(run) {}
  uint64_t bytes_read() const override {
    uint64_t n = 0;
    for (const auto& [path, f] : files_) n += f.zip().file().bytes_read();
    return n;
  }

 protected:
  void model(const MegTensor& t, const Shape& g, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float* dst) override {
    const int64_t pp = stage_of(t);
    const int64_t local_layer = t.layer < 0 ? -1 : t.layer - run_.stage_first[static_cast<size_t>(pp)];
    std::vector<float> tmp;
    for (const ShardRect& sr : shard_rects(t, g, run_.layout.tp, r0, nr, c0, nc)) {
      const io::TorchFile& f = file(sr.tp, pp, "model_optim_rng.pt");
      const io::PyValue* sd = f.root().get("model");
      MPT_CHECK(sd && sd->is_dict(), str(f.label(), " has no 'model' state dict"),
                f.root().get("model0") ? "virtual pipeline stages (model0, model1, …) are not read: re-save without them"
                                       : "");
      const io::PyValue* v = sd->get(t.full(local_layer));
      if (!v) v = sd->get(t.full_local(local_layer));
      MPT_CHECK(v && v->is_tensor(), str(f.label(), " has no tensor ", t.full_local(local_layer), " (nor ", t.full(local_layer), ")"),
                "the checkpoint's args do not match its state dict");
      const io::TorchTensor& tt = v->tensor();
      const Shape want = local_shape(g, t, run_.layout.tp);
      MPT_CHECK(tt.shape == want, str(f.label(), ": ", t.full(local_layer), " is ", shape_str(tt.shape), ", expected ",
                                      shape_str(want)),
                "the checkpoint's args do not match its tensors");
      tmp.resize(static_cast<size_t>(sr.rows * sr.cols));
      if (g.size() == 2) f.read_f32(tt, {sr.row, sr.col}, {sr.rows, sr.cols}, tmp.data());
      else f.read_f32(tt, {sr.row}, {sr.rows}, tmp.data());
      place(tmp.data(), sr.rows, sr.cols, dst, nc, sr.dst_row, sr.dst_col);
    }
  }

 private:
  const io::TorchFile& file(int64_t tp, int64_t pp, const char* name) {
    const std::string p = (fs::path(run_.dir.iter_dir) / mp_dir(tp, pp, run_.layout.pp) / name).string();
    auto it = files_.find(p);
    if (it == files_.end()) {
      MPT_CHECK(fs::exists(p), str("Megatron checkpoint file ", p, " is missing"),
                std::string(name) == "distrib_optim.pt"
                    ? "it was saved without the distributed optimizer: pass --no-load-optim (the weights are read)"
                    : "the checkpoint is incomplete");
      it = files_.emplace(p, io::TorchFile::open(p)).first;
    }
    return it->second;
  }
  void flat(int64_t tp, int64_t pp, int64_t bucket, int64_t start, const std::string& key, float* dst,
            int64_t n) override {
    const io::TorchFile& f = file(tp, pp, "distrib_optim.pt");
    const io::PyValue& root = f.root();
    const io::PyValue* coalesced = root.get("buckets_coalesced");
    MPT_CHECK(coalesced && coalesced->as_bool(), str(f.label(), " is not in the buckets_coalesced layout"),
              "re-save it with megatron-core >= 0.8 (DistributedOptimizer.save_parameter_state)");
    const io::PyValue* gbuf = root.get(int64_t{0});
    MPT_CHECK(gbuf && gbuf->is_dict() && gbuf->size() == 1 && !root.get(int64_t{1}),
              str(f.label(), " holds several grad buffers (dtypes or expert buffers)"), "not read yet");
    const io::PyValue& state = *gbuf->dict_items()[0].second;
    const MegatronBufferLayout& lay = layout(pp);
    int64_t unpadded = 0, offset = 0;
    for (size_t b = 0; b < lay.bucket_numel_unpadded.size(); ++b) {
      if (static_cast<int64_t>(b) == bucket) offset = unpadded;
      unpadded += lay.bucket_numel_unpadded[b];
    }
    MPT_CHECK(state.at("numel_unpadded").as_int() == unpadded,
              str(f.label(), ": numel_unpadded ", state.at("numel_unpadded").as_int(), ", but the args' model lays out ",
                  unpadded, " elements"),
              "the buffer was laid out differently (bucket size, parameter order): not read");
    const io::TorchTensor& t = state.at(key).tensor();
    f.read_f32(t, {offset + start}, {n}, dst);
  }
  std::map<std::string, io::TorchFile> files_;
};

class DistSource : public MegatronSource {
 public:
  explicit DistSource(const MegatronRun& run) : MegatronSource(run), ck_(run.dir.iter_dir) {}
  uint64_t bytes_read() const override { return ck_.bytes_read(); }

 protected:
  void model(const MegTensor& t, const Shape& g, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float* dst) override {
    const std::string pre = t.layer < 0 ? "" : "decoder.layers.";
    const std::string a = pre + t.name, b = pre + (t.local_name.empty() ? t.name : t.local_name);
    const std::string key = ck_.metadata().tensor(a) ? a : b;
    const io::DcpTensor* dt = ck_.metadata().tensor(key);
    MPT_CHECK(dt, str("torch_dist checkpoint ", run_.dir.iter_dir, " has no tensor ", a), "the checkpoint's args do not match it");
    Shape want = g, start = {r0}, count = {nr};
    if (g.size() == 2) start.push_back(c0), count.push_back(nc);
    if (t.layer >= 0) {
      want.insert(want.begin(), run_.cfg.num_layers);
      start.insert(start.begin(), t.layer);
      count.insert(count.begin(), 1);
    }
    MPT_CHECK(dt->size == want, str(key, " is ", shape_str(dt->size), " in ", run_.dir.iter_dir, ", expected ", shape_str(want)),
              "the checkpoint's args do not match its tensors");
    ck_.read_f32(key, start, count, dst);
  }

 private:
  void flat(int64_t tp, int64_t pp, int64_t bucket, int64_t start, const std::string& key, float* dst,
            int64_t n) override {
    const std::string head = str("optimizer.distributed.dp_group_idx_", tp + run_.layout.tp * pp, ".gbuf_idx_0.dtype_");
    const std::string tail = str(".bucket_idx_", bucket, ".", key);
    const io::DcpTensor* found = nullptr;
    for (const io::DcpTensor& t : ck_.metadata().tensors)
      if (t.fqn.rfind(head, 0) == 0 && t.fqn.size() > tail.size() &&
          t.fqn.compare(t.fqn.size() - tail.size(), tail.size(), tail) == 0)
        found = &t;
    MPT_CHECK(found, str("torch_dist checkpoint ", run_.dir.iter_dir, " has no optimizer tensor ", head, "…", tail),
              "it holds no distributed-optimizer state in the dp_reshardable layout (another "
              "--dist-ckpt-optim-fully-reshardable layout, or none): pass --no-load-optim to read the weights only");
    const int64_t unpadded = layout(pp).bucket_numel_unpadded[static_cast<size_t>(bucket)];
    MPT_CHECK(found->size.size() == 1 && found->size[0] >= unpadded,
              str(found->fqn, " is ", shape_str(found->size), ", but the args' model lays out ", unpadded, " elements"),
              "the buffer was laid out differently (bucket size, parameter order): not read");
    ck_.read_f32(found->fqn, {start}, {n}, dst);
  }
  io::DcpCheckpoint ck_;
};


// Megatron's opt_param_scheduler against this run's schedule (Megatron's own check: values
// that differ are refused unless --override-opt_param-scheduler / --use-checkpoint-opt_param-scheduler).
void check_scheduler(const io::PyValue& sched, const LoadOptions& o, const std::string& where) {
  if (o.lr_schedule.empty()) return;
  const nlohmann::json j = nlohmann::json::parse(o.lr_schedule);
  // The trainer's schedule record: Megatron's state_dict names (older records: lr, style, warmup_steps,
  // decay_steps in iterations).
  const auto at = [&](const char* key, const char* older) -> const nlohmann::json& {
    return j.contains(key) ? j.at(key) : j.at(older);
  };
  const bool samples = j.value("unit", "iterations") == "samples";
  const int64_t per = samples ? 1 : std::max<int64_t>(o.global_batch_size, 1);
  auto num = [&](const char* k) {
    const io::PyValue* v = sched.get(k);
    MPT_CHECK(v, str(where, ": opt_param_scheduler has no ", k), "");
    return v->as_float();
  };
  auto same = [](double a, double b) { return std::fabs(a - b) <= 1e-6 * std::max(std::fabs(a), std::fabs(b)); };
  const std::string hint =
      "give the value the Megatron run used, or --finetune (a new run from its weights) / --no-load-optim (its weights "
      "and position, a new optimizer and schedule state)";
  MPT_CHECK(same(num("max_lr"), at("max_lr", "lr").get<double>()),
            str(where, ": the checkpoint's max_lr ", num("max_lr"), " is not --lr ", at("max_lr", "lr").get<double>()), hint);
  MPT_CHECK(same(num("min_lr"), j.at("min_lr").get<double>()),
            str(where, ": the checkpoint's min_lr ", num("min_lr"), " is not --min-lr ", j.at("min_lr").get<double>()), hint);
  const io::PyValue* style = sched.get("lr_decay_style");
  MPT_CHECK(!style || style->as_str() == at("lr_decay_style", "style").get<std::string>(),
            str(where, ": the checkpoint's lr_decay_style ", style ? style->as_str() : "", " is not --lr-decay-style ",
                at("lr_decay_style", "style").get<std::string>()),
            hint);
  const int64_t warm = at("lr_warmup_steps", "warmup_steps").get<int64_t>() * per,
                decay = at("lr_decay_steps", "decay_steps").get<int64_t>() * per;
  MPT_CHECK(static_cast<int64_t>(num("lr_warmup_steps")) == warm,
            str(where, ": the checkpoint warms up over ", static_cast<int64_t>(num("lr_warmup_steps")),
                " samples, this run over ", warm, " (--lr-warmup-iters × --global-batch-size, or --lr-warmup-samples)"),
            hint);
  MPT_CHECK(static_cast<int64_t>(num("lr_decay_steps")) == decay,
            str(where, ": the checkpoint decays over ", static_cast<int64_t>(num("lr_decay_steps")),
                " samples, this run over ", decay, " (--lr-decay-iters × --global-batch-size, or --lr-decay-samples)"),
            hint);
}

}  // namespace

bool load_megatron_checkpoint(const MegatronDir& d, GPT& model, OptimState& opt, int64_t begin, int64_t end,
                              TrainState& st, const LoadOptions& o, SaveInfo* info, MPI_Comm comm) {
  Timer timer;
  const MegatronRun run = open_run(d);
  const GPTConfig& c = model.config();
  const std::string where = str("Megatron ", to_string(d.format), " checkpoint ", d.iter_dir);
  MPT_CHECK(!c.bert && !c.t5 && !c.moe(), str(where, ": only decoder (GPT / Llama) models are loaded from Megatron"), "");
  // The architecture: every field of the args' model against this run's.
  const std::string diff = field_differences(c, run.cfg);
  MPT_CHECK(diff.empty(), str(where, " has another architecture than this run: ", diff),
            "use the model flags the checkpoint was trained with (--use-checkpoint-args takes them from its args)");
  const io::PyValue& a = args_of(run.common);
  // Megatron records no tokenizer identity: its vocabulary size, when args has one, is checked.
  if (!o.tokenizer.empty() && arg(a, "vocab_size"))
    check_checkpoint_tokenizer(where, "", run.cfg.vocab_size, o.tokenizer, c.vocab_size, o.allow_tokenizer_change);
  const bool with_optim = o.load_optim && !o.finetune;
  MPT_CHECK(!with_optim || arg_bool(a, "use_distributed_optimizer", false),
            str(where, " was saved without --use-distributed-optimizer: its optimizer state (a per-parameter "
                       "torch.optim state dict) is not read"),
            "pass --no-load-optim to resume from its weights with fresh Adam moments");
  if (with_optim && arg_bool(a, "fp16", false))
    log_warn(where, " trained in fp16: its grad scaler's state is not read; the loss scale starts from this run's "
                    "flags (--initial-loss-scale)");
  std::unique_ptr<MegatronSource> src;
  if (d.format == MegatronFormat::TorchDist) src = std::make_unique<DistSource>(run);
  else src = std::make_unique<LegacySource>(run);

  const ParamSet& ps = model.params();
  std::map<std::string, ParamSpec> specs;
  for (const ParamSpec& s : param_table(c)) specs.emplace(s.name, s);
  const int64_t n = end - begin;
  std::vector<float> values(static_cast<size_t>(ps.numel()));
  std::vector<float> m(with_optim ? static_cast<size_t>(n) : 0), v(m.size());
  double bytes = 0;
  // This rank's elements [lo, hi) of p from `key`, into out (local element lo first): each global
  // rectangle it holds, its qkv rows mapped to Megatron's in runs that stay consecutive.
  const auto fill = [&](const ParamInfo& p, const MegTensor& t, const Shape& g, const std::string& key, int64_t lo,
                        int64_t hi, float* out) {
    const auto meg_row = [&](int64_t r) { return t.qkv ? megatron_qkv_row(c, r) : r; };
    for (const GlobalPiece& pc : global_pieces(p, lo, hi)) {
      const bool two = g.size() == 2;
      const int64_t s0 = pc.start[0], n0 = pc.count[0], s1 = two ? pc.start[1] : 0, n1 = two ? pc.count[1] : 1;
      float* d = out + (pc.local_begin - lo);
      for (int64_t r = s0; r < s0 + n0;) {
        const int64_t m = meg_row(r);
        int64_t len = 1;
        if (!t.qkv) len = s0 + n0 - r;
        else
          while (r + len < s0 + n0 && meg_row(r + len) == m + len) ++len;
        src->read(t, g, key, m, len, s1, n1, d + (r - s0) * n1);
        r += len;
      }
    }
    bytes += 4.0 * static_cast<double>(hi - lo);
  };
  for (const ParamInfo& p : ps.infos()) {
    const ParamSpec& spec = specs.at(p.name);
    const MegTensor t = megatron_of(spec, c);
    const Shape& g = spec.global_shape;
    // With the optimizer, the fp32 master weights are the values (bf16 weights are their rounding).
    fill(p, t, g, with_optim ? "param" : "", 0, p.numel(), values.data() + p.offset);
    if (!with_optim) continue;
    const int64_t lo = std::max(begin, p.offset) - p.offset, hi = std::min(end, p.offset + p.numel()) - p.offset;
    if (hi <= lo) continue;
    fill(p, t, g, "exp_avg", lo, hi, m.data() + (p.offset + lo - begin));
    fill(p, t, g, "exp_avg_sq", lo, hi, v.data() + (p.offset + lo - begin));
  }
  opt.begin = begin;
  opt.master = Tensor::from_vector(std::vector<float>(values.begin() + begin, values.begin() + end), {n});
  opt.exp_avg = with_optim ? Tensor::from_vector(m, {n}) : Tensor();
  opt.exp_avg_sq = with_optim ? Tensor::from_vector(v, {n}) : Tensor();
  model.params().values().copy_from(
      Tensor::from_vector(values, {ps.numel()}).to(model.params().values().dtype()).to(model.device()));
  if (!o.finetune) {
    const io::PyValue* it = run.common.root().get("iteration");
    st.iteration = it ? it->as_int() : d.iteration;
    st.consumed_train_samples = arg_int(a, "consumed_train_samples", 0);
    st.consumed_valid_samples = arg_int(a, "consumed_valid_samples", 0);
    st.skipped_iterations = 0;
    st.skipped_samples = arg_int(a, "skipped_train_samples", 0);
    if (with_optim) opt.steps = st.iteration;  // torch's Adam counts every step (bf16 / fp32 skip none)
    const io::PyValue* sched = run.common.root().get("opt_param_scheduler");
    if (sched && with_optim) check_scheduler(*sched, o, where);
    // Megatron's RNG states are torch / CUDA generator states: mpitron's streams are a pure
    // function of (seed, iteration), so the seed is what carries over.
    if (o.load_rng) st.seed = static_cast<uint64_t>(arg_int(a, "seed", static_cast<int64_t>(st.seed)));
  }
  // What this rank read of the checkpoint's files (tensor reads, after the metadata) beside their size.
  double read = static_cast<double>(src->bytes_read()), most = read;
  if (comm != MPI_COMM_NULL) {
    allreduce_bounded(&bytes, 1, MPI_DOUBLE, MPI_SUM, comm, "checkpoint bytes");
    allreduce_bounded(&most, 1, MPI_DOUBLE, MPI_MAX, comm, "checkpoint bytes read");
  }
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(d.iter_dir, ec))
    if (e.is_regular_file(ec)) total += e.file_size(ec);
  log_info("Megatron checkpoint ", d.iter_dir, ": ", static_cast<uint64_t>(most), " bytes read by the busiest rank (",
           static_cast<uint64_t>(read), " by this one) of ", total, " in its files");
  if (info) {
    info->dir = d.iter_dir;
    info->seconds = timer.seconds();
    info->bytes = bytes;
  }
  return true;
}

}  // namespace mpitron
