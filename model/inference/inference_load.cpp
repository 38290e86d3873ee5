#include "model/inference/inference_load.h"

#include "model/config_json.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/json.h"
#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "model/training/checkpointing.h"
#include "model/training/optimizer.h"

namespace mpitron {

namespace {

io::CheckpointReader open_or_throw(const std::string& load_dir) {
  io::CheckpointReader r = io::CheckpointReader::open_latest(load_dir);
  MPT_CHECK(r.found(), str("no checkpoint in ", load_dir),
            "pass the directory given to pretrain_gpt --save (it holds latest_checkpointed_iteration.txt)");
  return r;
}

GPTConfig config_from(const io::CheckpointReader& r) {
  MPT_CHECK(r.has_attr("model_config"), str("checkpoint ", r.path(), " has no model_config attribute"),
            "was it written by mpitron's save_checkpoint?");
  return config_from_json(r.attr_json("model_config"), str("checkpoint ", r.path()));
}

}  // namespace

bool checkpoint_exists(const std::string& load_dir) {
  return std::filesystem::exists(std::filesystem::path(load_dir) / io::kTrackerFileName);
}

GPTConfig read_checkpoint_config(const std::string& load_dir) { return config_from(open_or_throw(load_dir)); }

InferenceModel load_model_for_inference(const std::string& load_dir, Device device, DType dtype) {
  io::CheckpointReader r = open_or_throw(load_dir);
  GPTConfig cfg = config_from(r);
  cfg.compute_dtype = dtype;
  InferenceModel out;
  out.model = std::make_unique<GPT>(cfg, device);
  out.iteration = r.iteration();
  out.dir = r.dir();
  const ParamSet& ps = out.model->params();
  for (const ParamInfo& p : ps.infos()) {
    const std::string name = "model/" + p.name;
    MPT_CHECK(r.has_tensor(name), str("checkpoint ", r.path(), " has no tensor ", name), "");
    const io::TensorInfo ti = r.tensor_info(name);
    MPT_CHECK(ti.shape == p.shape,
              str("checkpoint tensor ", name, " is ", shape_str(ti.shape), ", its model_config implies ", shape_str(p.shape)),
              "the checkpoint is inconsistent with its own model_config");
    const Tensor w = r.read(name).to(DType::F32);
    const float* v = w.data<float>();
    MPT_CHECK(std::all_of(v, v + w.numel(), [](float x) { return std::isfinite(x); }),
              str("checkpoint tensor ", name, " in ", r.path(), " holds non-finite values (NaN or Inf)"),
              "the checkpoint was saved from a diverged run; pass --load a directory with an earlier checkpoint");
    ps.values().flat_range(p.offset, p.numel()).view(p.shape).copy_from(w.to(dtype).to(device));
  }
  return out;
}

// ---------------------------------------------------------------------------
// Hugging Face GPT-2

namespace {

struct HfName {
  std::string hf, ours;
  bool transpose;
};

std::vector<HfName> hf_names(int64_t layers) {
  std::vector<HfName> v{{"wte.weight", "wte", false}, {"wpe.weight", "wpe", false}};
  for (int64_t l = 0; l < layers; ++l) {
    const std::string h = str("h.", l, "."), o = str("layers.", l, ".");
    v.push_back({h + "ln_1.weight", o + "ln1.weight", false});
    v.push_back({h + "ln_1.bias", o + "ln1.bias", false});
    v.push_back({h + "attn.c_attn.weight", o + "attn.qkv.weight", true});
    v.push_back({h + "attn.c_attn.bias", o + "attn.qkv.bias", false});
    v.push_back({h + "attn.c_proj.weight", o + "attn.proj.weight", true});
    v.push_back({h + "attn.c_proj.bias", o + "attn.proj.bias", false});
    v.push_back({h + "ln_2.weight", o + "ln2.weight", false});
    v.push_back({h + "ln_2.bias", o + "ln2.bias", false});
    v.push_back({h + "mlp.c_fc.weight", o + "mlp.fc.weight", true});
    v.push_back({h + "mlp.c_fc.bias", o + "mlp.fc.bias", false});
    v.push_back({h + "mlp.c_proj.weight", o + "mlp.proj.weight", true});
    v.push_back({h + "mlp.c_proj.bias", o + "mlp.proj.bias", false});
  }
  v.push_back({"ln_f.weight", "lnf.weight", false});
  v.push_back({"ln_f.bias", "lnf.bias", false});
  return v;
}

std::string hf_prefix(const io::Safetensors& st) {
  if (st.has("transformer.wte.weight")) return "transformer.";
  if (st.has("wte.weight")) return "";
  MPT_THROW("safetensors file has neither transformer.wte.weight nor wte.weight: not a GPT-2 checkpoint",
            "convert a Hugging Face GPT2LMHeadModel / GPT2Model checkpoint");
}

int64_t hf_layers(const io::Safetensors& st, const std::string& pre) {
  int64_t l = 0;
  while (st.has(str(pre, "h.", l, ".ln_1.weight"))) ++l;
  return l;
}

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

}  // namespace

GPTConfig hf_gpt2_config(const io::Safetensors& st, const std::string& hf_config_json, int64_t num_attention_heads,
                         int64_t divisible_by) {
  const std::string pre = hf_prefix(st);
  const Shape wte = st.at(pre + "wte.weight").shape, wpe = st.at(pre + "wpe.weight").shape;
  MPT_CHECK(wte.size() == 2 && wpe.size() == 2 && wte[1] == wpe[1],
            str("wte ", shape_str(wte), " and wpe ", shape_str(wpe), " are not (V, C) and (P, C)"), "");
  GPTConfig c;
  c.num_layers = hf_layers(st, pre);
  MPT_CHECK(c.num_layers >= 1, "safetensors file has no h.0.* tensors", "");
  c.hidden_size = wte[1];
  c.vocab_size = wte[0];
  c.max_position_embeddings = wpe[0];
  c.seq_length = wpe[0];
  const Shape fc = st.at(str(pre, "h.0.mlp.c_fc.weight")).shape;
  MPT_CHECK(fc.size() == 2 && fc[0] == c.hidden_size, str("h.0.mlp.c_fc.weight is ", shape_str(fc), ", expected (C, F)"), "");
  c.ffn_hidden_size = fc[1];
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  int64_t heads = num_attention_heads;
  if (!hf_config_json.empty()) {
    const nlohmann::json j = parse_json_text(hf_config_json, "HF config.json");
    const auto check = [&](const char* key, int64_t want) {
      if (j.contains(key) && !j[key].is_null())
        MPT_CHECK(j[key].get<int64_t>() == want, str("HF config ", key, " = ", j[key].dump(), " but the weights say ", want), "");
    };
    check("n_embd", c.hidden_size);
    check("n_layer", c.num_layers);
    check("n_positions", c.max_position_embeddings);
    check("vocab_size", c.vocab_size);
    check("n_inner", c.ffn_hidden_size);
    if (j.contains("layer_norm_epsilon")) c.layernorm_epsilon = j["layer_norm_epsilon"].get<float>();
    if (j.contains("n_head")) {
      const int64_t h = j["n_head"].get<int64_t>();
      MPT_CHECK(heads == 0 || heads == h, str("--num-attention-heads ", heads, " contradicts the HF config's n_head ", h), "");
      heads = h;
    }
    if (j.contains("activation_function"))
      MPT_CHECK(j["activation_function"] == "gelu_new" || j["activation_function"] == "gelu_pytorch_tanh",
                str("HF activation_function ", j["activation_function"].dump(), " is not the tanh GELU mpitron computes"), "");
  }
  MPT_CHECK(heads >= 1, "the number of attention heads is not in the weights",
            "pass the HF config.json (--hf-config) or --num-attention-heads");
  c.num_attention_heads = heads;
  c.padded_vocab_size = data::padded_vocab_size(c.vocab_size, 1, static_cast<int>(divisible_by));
  c.validate();
  return c;
}

std::unique_ptr<GPT> gpt_from_hf_gpt2(const io::Safetensors& st, const GPTConfig& cfg) {
  const std::string pre = hf_prefix(st);
  auto model = std::make_unique<GPT>(cfg, Device::cpu());
  const ParamSet& ps = model->params();
  ps.values().zero();
  std::vector<bool> used(st.tensors.size(), false);
  for (const HfName& n : hf_names(cfg.num_layers)) {
    const std::string name = pre + n.hf;
    const int64_t i = st.index(name);
    MPT_CHECK(i >= 0, str("safetensors file has no ", name), "is it a complete GPT-2 checkpoint?");
    used[static_cast<size_t>(i)] = true;
    Tensor t = st.to_f32(name);
    if (n.transpose) {
      MPT_CHECK(t.ndim() == 2, str(name, " is ", shape_str(t.shape()), ", expected a matrix"), "");
      t = t.transpose(0, 1).contiguous();
    }
    const ParamInfo& p = ps.info(n.ours);
    Tensor dst = ps.values().flat_range(p.offset, p.numel()).view(p.shape);
    if (n.ours == "wte") dst = dst.slice(0, 0, cfg.vocab_size);  // padding rows stay zero
    MPT_CHECK(t.shape() == dst.shape(), str(name, " is ", shape_str(t.shape()), " (after transposing: ", n.transpose,
                                            "), mpitron's ", n.ours, " needs ", shape_str(dst.shape())), "");
    dst.copy_from(t.to(cfg.compute_dtype));
  }
  for (size_t i = 0; i < st.tensors.size(); ++i) {
    if (used[i]) continue;
    const std::string& name = st.tensors[i].name;
    if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) continue;  // causal mask buffers
    if (name == "lm_head.weight") {
      const Tensor a = st.to_f32(name), w = st.to_f32(pre + "wte.weight");
      MPT_CHECK(a.shape() == w.shape() && a.to_floats() == w.to_floats(),
                "lm_head.weight differs from wte.weight: an untied output layer", "mpitron ties the LM head to wte");
      continue;
    }
    MPT_THROW(str("safetensors tensor ", name, " is not part of a GPT-2 model"), "");
  }
  return model;
}

std::string save_model_checkpoint(const std::string& save_dir, const GPT& model, const std::string& note) {
  // The optimizer only reads the values here (f32: master weights alias them).
  AdamWOptimizer opt(const_cast<ParamSet&>(model.params()), OptimizerConfig{});
  LossScaler scaler;
  TrainState st;
  const nlohmann::json flags = {{"converted_from", note}};
  return save_checkpoint(save_dir, model, opt, scaler, st, flags.dump(), "{}").dir;
}

io::Safetensors hf_gpt2_from_gpt(const GPT& model, const HfExportOptions& o) {
  const GPTConfig& c = model.config();
  const ParamSet& ps = model.params();
  io::Safetensors st;
  for (const HfName& n : hf_names(c.num_layers)) {
    const ParamInfo& p = ps.info(n.ours);
    Tensor t = ps.values().flat_range(p.offset, p.numel()).view(p.shape).to(Device::cpu()).to(DType::F32);
    if (n.ours == "wte") t = t.slice(0, 0, c.vocab_size);
    if (n.transpose) t = t.transpose(0, 1);
    st.add_f32(o.prefix + n.hf, t.contiguous(), o.dtype);
  }
  if (o.lm_head) {
    const ParamInfo& p = ps.info("wte");
    st.add_f32("lm_head.weight",
               ps.values().flat_range(p.offset, p.numel()).view(p.shape).to(Device::cpu()).to(DType::F32).slice(0, 0, c.vocab_size).contiguous(),
               o.dtype);
  }
  st.metadata["format"] = "pt";
  return st;
}

std::string hf_gpt2_config_json(const GPTConfig& c) {
  const nlohmann::json j = {{"architectures", {"GPT2LMHeadModel"}},
                            {"model_type", "gpt2"},
                            {"activation_function", "gelu_new"},
                            {"n_embd", c.hidden_size},
                            {"n_head", c.num_attention_heads},
                            {"n_layer", c.num_layers},
                            {"n_positions", c.max_position_embeddings},
                            {"n_ctx", c.max_position_embeddings},
                            {"n_inner", c.ffn()},
                            {"vocab_size", c.vocab_size},
                            {"layer_norm_epsilon", c.layernorm_epsilon},
                            {"bos_token_id", 50256},
                            {"eos_token_id", 50256},
                            {"tie_word_embeddings", true},
                            {"resid_pdrop", 0.0},
                            {"embd_pdrop", 0.0},
                            {"attn_pdrop", 0.0}};
  return j.dump(2);
}

}  // namespace mpitron
