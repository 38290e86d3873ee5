#include "model/inference/inference_flags.h"

#include "core/error.h"
#include "model/checkpoint_args.h"
#include "model/training/megatron_compat.h"

namespace po = boost::program_options;

namespace mpitron {

namespace {

struct Ignored {
  const char* name;
  bool takes_value;
  const char* why;
};

// Pretraining flags a generation/evaluation script carries that inference has no use for.
const Ignored kIgnored[] = {
    {"no-load-optim", false, "inference reads only the weights"},
    {"no-load-rng", false, "inference reads only the weights"},
    {"use-checkpoint-args", false, "the model shape always comes from the checkpoint here"},
    {"make-vocab-size-divisible-by", true, "the checkpoint's padded vocabulary is used"},
    {"init-method-std", true, "the weights come from the checkpoint"},
    {"hidden-dropout", true, "inference runs without dropout"},
    {"attention-dropout", true, "inference runs without dropout"},
    {"log-interval", true, "inference logs per sample or per evaluation"},
};

}  // namespace

void add_inference_flags(po::options_description& desc, InferenceFlags& f, bool with_seq_length) {
  po::options_description g("Megatron GPT_ARGS (the model shape is checked against the checkpoint)");
  GPTConfig& m = f.shape;
  f.with_seq_length = with_seq_length;
  g.add_options()
      ("num-layers", po::value(&m.num_layers), "transformer blocks")
      ("hidden-size", po::value(&m.hidden_size), "residual stream width")
      ("num-attention-heads", po::value(&m.num_attention_heads), "attention heads")
      ("ffn-hidden-size", po::value(&m.ffn_hidden_size), "MLP width")
      ("max-position-embeddings", po::value(&m.max_position_embeddings), "position table rows")
      ("layernorm-epsilon", po::value(&m.layernorm_epsilon), "layernorm epsilon")
      ("fp16", po::bool_switch(&f.fp16), "run the model in fp16 (weights rounded from the f32 checkpoint)")
      ("bf16", po::bool_switch(&f.bf16), "run the model in bf16");
  if (with_seq_length) g.add_options()("seq-length", po::value(&m.seq_length), "tokens per sample in training");
  for (const Ignored& i : kIgnored) {
    if (i.takes_value) g.add_options()(i.name, po::value<std::string>(), i.why);
    else g.add_options()(i.name, po::bool_switch(), i.why);
  }
  desc.add(g);
  add_architecture_flags(desc, f.arch);
  add_noop_flags(desc);
}

void check_inference_flags(const po::variables_map& vm, InferenceFlags& f) {
  MPT_CHECK(!(f.fp16 && f.bf16), "--fp16 and --bf16 were both given", "pick one");
  for (const Ignored& i : kIgnored) {
    if (!vm.count(i.name)) continue;
    if (!i.takes_value && !vm[i.name].as<bool>()) continue;
    f.notes.push_back(str("--", i.name, ": ", i.why));
  }
  check_noop_flags(vm, f.notes);
}

void check_against_checkpoint(const po::variables_map& vm, const InferenceFlags& f, const GPTConfig& checkpoint,
                              const std::string& load_dir) {
  MPT_CHECK(!checkpoint.bert,
            str("checkpoint ", load_dir, " holds a BERT (pretrain_bert): generate_text, evaluate and the server run "
                "decoder language models (GPT-2, Llama)"),
            "use a pretrain_gpt checkpoint; a BERT is fine-tuned with finetune or exported with convert_checkpoint");
  GPTConfig m = f.shape;
  apply_architecture_flags(vm, f.arch, m);
  reconcile_model_flags(vm, checkpoint, m, /*fill=*/false, load_dir, f.with_seq_length);
}

}  // namespace mpitron
