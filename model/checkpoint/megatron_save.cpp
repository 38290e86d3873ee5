#include "model/checkpoint/megatron_save.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "core/files.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "io/torch_save.h"
#include "model/arch_fields.h"
#include "model/checkpoint/checkpoint_config.h"
#include "model/checkpoint/megatron_names.h"
#include "model/param_table.h"

namespace mpitron {

namespace fs = std::filesystem;

namespace {

constexpr int kDepth = 64;  // nesting of what is built here (a few levels)

io::PyPtr s(const std::string& v) { return io::PyValue::string(v); }
io::PyPtr i(int64_t v) { return io::PyValue::integer(v); }
io::PyPtr f(double v) { return io::PyValue::floating(v); }
io::PyPtr b(bool v) { return io::PyValue::boolean(v); }

// Megatron-LM's arguments for c at the layout written (what its parse_args gives such a run, the
// model's part of it and what load_checkpoint / check_checkpoint_args read).
io::PyPtr megatron_args(const GPTConfig& c, const TrainState& st, const MegatronSaveOptions& o) {
  io::PyMut d = io::PyValue::dict();
  auto set = [&](const char* k, const io::PyPtr& v) { d->set_item(s(k), v, kDepth); };
  const bool learned = c.position_embedding == PositionEmbedding::Learned;
  set("num_layers", i(c.num_layers));
  set("hidden_size", i(c.hidden_size));
  set("ffn_hidden_size", i(c.ffn()));
  set("num_attention_heads", i(c.num_attention_heads));
  set("group_query_attention", b(c.query_groups() != c.num_attention_heads));
  set("num_query_groups", i(c.query_groups()));
  set("kv_channels", i(c.head_dim()));
  set("max_position_embeddings", i(c.max_position_embeddings));
  set("seq_length", i(c.seq_length));
  set("position_embedding_type",
      s(learned ? "learned_absolute" : c.position_embedding == PositionEmbedding::Rope ? "rope" : "none"));
  set("add_position_embedding", b(learned));
  if (c.rotary_base == std::floor(c.rotary_base) && std::fabs(c.rotary_base) < 1e15)
    set("rotary_base", i(static_cast<int64_t>(c.rotary_base)));  // an int argument in Megatron-LM
  else set("rotary_base", f(c.rotary_base));
  set("rotary_percent", f(c.rotary_percent));
  set("normalization", s(c.normalization == Normalization::RMSNorm ? "RMSNorm" : "LayerNorm"));
  set("norm_epsilon", f(c.layernorm_epsilon));
  set("apply_layernorm_1p", b(c.layernorm_1p));
  set("swiglu", b(c.mlp == MlpKind::SwiGLU));
  set("openai_gelu", b(c.mlp == MlpKind::GeluTanh));  // the tanh GELU with or without a bias
  set("bias_gelu_fusion", b(false));
  set("add_bias_linear", b(c.add_bias_linear));
  set("add_qkv_bias", b(c.add_bias_linear || c.add_qkv_bias));
  set("untie_embeddings_and_output_weights", b(c.untie_embeddings));
  set("hidden_dropout", f(c.hidden_dropout));
  set("attention_dropout", f(c.attention_dropout));
  set("init_method_std", f(c.init_method_std));
  set("vocab_size", i(c.vocab_size));
  set("padded_vocab_size", i(c.padded_vocab_size));
  set("make_vocab_size_divisible_by", i(o.make_vocab_size_divisible_by));
  set("tokenizer_type", s(o.tokenizer_type));
  set("num_experts", io::PyValue::none());
  set("tensor_model_parallel_size", i(o.tp));
  set("pipeline_model_parallel_size", i(o.pp));
  set("virtual_pipeline_model_parallel_size", io::PyValue::none());
  set("context_parallel_size", i(1));
  set("expert_model_parallel_size", i(1));
  set("data_parallel_size", i(1));
  set("world_size", i(o.tp * o.pp));
  set("transformer_impl", s("local"));
  set("params_dtype", io::PyValue::global("torch.float32"));
  set("fp16", b(false));
  set("bf16", b(false));
  set("use_distributed_optimizer", b(false));
  set("ckpt_format", s("torch"));
  set("use_dist_ckpt", b(false));
  set("data_parallel_random_init", b(false));
  set("seed", i(static_cast<int64_t>(st.seed)));
  set("iteration", i(st.iteration));
  set("consumed_train_samples", i(st.consumed_train_samples));
  set("consumed_valid_samples", i(st.consumed_valid_samples));
  set("skipped_train_samples", i(st.skipped_samples));
  io::PyMut ns = io::PyValue::object("argparse.Namespace", io::PyValue::tuple({}));
  ns->set_state(d, kDepth);
  return ns;
}

// The GPTModel submodules that hold an `_extra_state` (Megatron's parallel linear layers), after
// the roles that make their parameters; state-dict order is registration order (the local spec).
struct Group {
  std::vector<ParamRole> roles;
  const char* extra_state;  // module whose _extra_state follows, or nullptr
};
const std::vector<Group>& block_groups() {
  static const std::vector<Group> g = {
      {{ParamRole::Norm1Weight, ParamRole::Norm1Bias}, nullptr},
      {{ParamRole::ProjWeight, ParamRole::ProjBias}, "self_attention.linear_proj"},
      {{ParamRole::QkvWeight, ParamRole::QkvBias}, "self_attention.linear_qkv"},
      {{ParamRole::Norm2Weight, ParamRole::Norm2Bias}, nullptr},
      {{ParamRole::FcWeight, ParamRole::FcBias}, "mlp.linear_fc1"},
      {{ParamRole::MlpProjWeight, ParamRole::MlpProjBias}, "mlp.linear_fc2"},
  };
  return g;
}

// Global values of each parameter (mpitron's layout), from a one-process model.
class Globals {
 public:
  explicit Globals(const GPT& model) : values_(model.params().values().to_floats()) {
    for (const ParamInfo& p : model.params().infos()) {
      MPT_CHECK(p.shape == p.global_shape,
                str("writing a Megatron checkpoint: ", p.name, " is a shard (", shape_str(p.shape), " of ",
                    shape_str(p.global_shape), ")"),
                "write from one process holding the whole model (convert_checkpoint --direction mpitron-to-megatron)");
      infos_.emplace(p.name, &p);
    }
  }
  const float* of(const ParamSpec& spec) const {
    auto it = infos_.find(spec.name);
    MPT_CHECK(it != infos_.end(), str("internal: the model has no parameter ", spec.name), "");
    return values_.data() + it->second->offset;
  }

 private:
  std::vector<float> values_;
  std::map<std::string, const ParamInfo*> infos_;
};

// TP rank t's shard of the Megatron tensor t of global value g (mpitron's layout, shape `shape`),
// row-major in Megatron's local layout.
std::vector<float> megatron_shard(const GPTConfig& c, const MegTensor& t, const Shape& shape, const float* g,
                                  int64_t tp, int64_t rank, Shape& local) {
  const int64_t rows = shape[0], cols = shape.size() == 2 ? shape[1] : 1;
  // Megatron's global row order: mpitron row r lands at megatron_qkv_row(r).
  std::vector<int64_t> src(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) src[static_cast<size_t>(t.qkv ? megatron_qkv_row(c, r) : r)] = r;
  local = shape;
  std::vector<float> out;
  if (t.tp_axis < 0 || tp == 1) {
    out.resize(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(g + src[static_cast<size_t>(r)] * cols, cols, out.data() + r * cols);
  } else if (t.tp_axis == 1) {
    const int64_t w = cols / tp;
    local[1] = w;
    out.resize(static_cast<size_t>(rows * w));
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(g + src[static_cast<size_t>(r)] * cols + rank * w, w, out.data() + r * w);
  } else {
    const std::vector<int64_t> parts = t.parts.empty() ? std::vector<int64_t>{rows} : t.parts;
    int64_t start = 0;
    for (const int64_t part : parts) {
      const int64_t per = part / tp;
      for (int64_t r = start + rank * per; r < start + (rank + 1) * per; ++r)
        out.insert(out.end(), g + src[static_cast<size_t>(r)] * cols, g + (src[static_cast<size_t>(r)] + 1) * cols);
      start += part;
    }
    local[0] = rows / tp;
  }
  return out;
}

std::string mp_dir_name(int64_t tp, int64_t pp, int64_t pp_size) {
  char buf[40];
  if (pp_size == 1) std::snprintf(buf, sizeof buf, "mp_rank_%02lld", static_cast<long long>(tp));
  else std::snprintf(buf, sizeof buf, "mp_rank_%02lld_%03lld", static_cast<long long>(tp), static_cast<long long>(pp));
  return buf;
}

void check_layout(const GPTConfig& c, const MegatronSaveOptions& o) {
  auto divides = [&](int64_t n, const char* what) {
    MPT_CHECK(n % o.tp == 0, str("--target-tensor-parallel-size ", o.tp, " does not divide the ", what, " (", n, ")"),
              "choose a tensor-parallel size that divides the heads, query groups, FFN width and padded vocabulary");
  };
  MPT_CHECK(o.tp >= 1 && o.pp >= 1, str("Megatron layout TP ", o.tp, " × PP ", o.pp), "sizes are >= 1");
  divides(c.num_attention_heads, "attention heads");
  divides(c.query_groups(), "query groups");
  divides(c.ffn(), "FFN width");
  divides(c.padded_vocab_size, "padded vocabulary");
  MPT_CHECK(c.num_layers % o.pp == 0,
            str("--target-pipeline-model-parallel-size ", o.pp, " does not divide the ", c.num_layers, " layers"),
            "Megatron's legacy loader splits the layers evenly: choose a size that divides them");
}

}  // namespace

void check_megatron_save(const GPTConfig& c, const MegatronSaveOptions& o) {
  MPT_CHECK(!c.bert && !c.t5 && !c.moe(), str("a ", c.family(), " model is not written as a Megatron GPTModel checkpoint"),
            "only dense GPT-2 / Llama-style models are written in Megatron's format (MoE, BERT, T5 are not yet)");
  check_layout(c, o);
  TrainState st;
  const io::PyPtr args = megatron_args(c, st, o);
  // The round trip through the args must give back this architecture: anything GPTModel (or
  // these args) cannot express is refused here, naming it, instead of loading as another model.
  const std::string diff = field_differences(c, megatron_config_of_args(*args, "the Megatron args written"));
  MPT_CHECK(diff.empty(), str("this model has no Megatron GPTModel form: ", diff),
            "write it in mpitron's format or export it to Hugging Face (convert_checkpoint --direction mpitron-to-hf)");
  for (const ParamSpec& spec : param_table(c)) megatron_of(spec, c);  // refuses what has no counterpart
}

MegatronSaved save_megatron_checkpoint(const GPT& model, const TrainState& st, const std::string& dir,
                                       const MegatronSaveOptions& o) {
  const GPTConfig& c = model.config();
  check_megatron_save(c, o);
  const io::PyPtr args = megatron_args(c, st, o);
  std::vector<std::pair<ParamSpec, MegTensor>> table;
  for (const ParamSpec& spec : param_table(c)) table.emplace_back(spec, megatron_of(spec, c));
  const Globals g(model);

  char iter_name[32];
  std::snprintf(iter_name, sizeof iter_name, "iter_%07lld", static_cast<long long>(st.iteration));
  MegatronSaved out;
  out.iter_dir = (fs::path(dir) / iter_name).string();
  const int64_t per = c.num_layers / o.pp;
  for (int64_t pp = 0; pp < o.pp; ++pp) {
    for (int64_t tp = 0; tp < o.tp; ++tp) {
      io::TorchSaveWriter w;
      io::PyMut sd = io::PyValue::dict("collections.OrderedDict");
      auto add = [&](const ParamSpec& spec, const MegTensor& t, const std::string& key) {
        Shape local;
        const std::vector<float> v = megatron_shard(c, t, spec.global_shape, g.of(spec), o.tp, tp, local);
        sd->set_item(s(key), w.tensor_f32(local, v), kDepth);
      };
      auto role = [&](ParamRole r, int64_t layer) -> const std::pair<ParamSpec, MegTensor>* {
        for (const auto& e : table)
          if (e.first.role == r && (layer < 0 || e.first.layer == layer)) return &e;
        return nullptr;
      };
      const bool first = pp == 0, last = pp == o.pp - 1;
      if (first)
        for (ParamRole r : {ParamRole::WordEmbedding, ParamRole::PositionEmbedding})
          if (const auto* e = role(r, -1)) add(e->first, e->second, e->second.full_local(-1));
      for (int64_t l = pp * per; l < (pp + 1) * per; ++l) {
        for (const Group& grp : block_groups()) {
          for (ParamRole r : grp.roles)
            if (const auto* e = role(r, l)) add(e->first, e->second, e->second.full_local(l - pp * per));
          if (grp.extra_state)
            sd->set_item(s(str("decoder.layers.", l - pp * per, ".", grp.extra_state, "._extra_state")),
                         io::PyValue::none(), kDepth);
        }
      }
      if (last) {
        for (ParamRole r : {ParamRole::FinalNormWeight, ParamRole::FinalNormBias})
          if (const auto* e = role(r, -1)) add(e->first, e->second, e->second.full_local(-1));
        if (const auto* e = role(ParamRole::OutputWeight, -1)) add(e->first, e->second, "output_layer.weight");
        else if (o.pp > 1)  // the tied embedding's copy on the last stage
          if (const auto* e = role(ParamRole::WordEmbedding, -1)) add(e->first, e->second, "output_layer.weight");
        sd->set_item(s("output_layer._extra_state"), io::PyValue::none(), kDepth);
      }
      io::PyMut root = io::PyValue::dict();
      root->set_item(s("args"), args, kDepth);
      root->set_item(s("checkpoint_version"), f(3.0), kDepth);
      root->set_item(s("iteration"), i(st.iteration), kDepth);
      root->set_item(s("model"), sd, kDepth);
      const fs::path file = fs::path(out.iter_dir) / mp_dir_name(tp, pp, o.pp) / "model_optim_rng.pt";
      std::error_code ec;
      MPT_CHECK(o.overwrite || !fs::exists(file, ec), str(file.string(), " already exists"),
                "choose another output directory, or pass --overwrite");
      fs::create_directories(file.parent_path(), ec);
      MPT_CHECK(!ec, str("cannot create ", file.parent_path().string(), ": ", ec.message()), "check the permissions");
      out.bytes += w.save(file.string(), *root);
      out.files.push_back(file.string());
    }
  }
  if (o.write_tracker)
    write_file_checked((fs::path(dir) / io::kTrackerFileName).string(), std::to_string(st.iteration),
                       "Megatron's latest_checkpointed_iteration.txt");
  log_info("wrote Megatron torch checkpoint ", out.iter_dir, ": ", out.files.size(), " file(s) (TP ", o.tp, " x PP ",
           o.pp, "), ", out.bytes, " bytes");
  return out;
}

}  // namespace mpitron

namespace mpitron {

void save_megatron_beside(const std::string& save_dir, const MegatronSaveOptions& o, MPI_Comm comm) {
  int rank = 0;
  if (comm != MPI_COMM_NULL) MPI_Comm_rank(comm, &rank);
  std::string failure;
  if (rank == 0) {
    try {
      GPT model(read_checkpoint_config(save_dir), Device::cpu());
      TrainState st;
      MPT_CHECK(load_weights(save_dir, model, {}, &st), str(save_dir, " holds no checkpoint"), "");
      MegatronSaveOptions mo = o;
      mo.write_tracker = false;
      mo.overwrite = true;  // a save of an iteration replaces its files, as mpitron's own
      save_megatron_checkpoint(model, st, save_dir, mo);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (comm != MPI_COMM_NULL) {
    int n = static_cast<int>(failure.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, comm);
    failure.resize(static_cast<size_t>(n));
    if (n > 0) MPI_Bcast(failure.data(), n, MPI_CHAR, 0, comm);
  }
  MPT_CHECK(failure.empty(), str("--ckpt-format torch: writing Megatron's files beside the checkpoint failed: ", failure),
            "");
}

}  // namespace mpitron
