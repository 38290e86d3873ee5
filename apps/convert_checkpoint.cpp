// convert_checkpoint — Hugging Face GPT-2 safetensors <-> mpitron HDF5 checkpoint.
//   convert_checkpoint --direction hf-to-mpitron --input gpt2/model.safetensors
//       --hf-config gpt2/config.json --output ckpt/gpt2
//   convert_checkpoint --direction mpitron-to-hf --input ckpt/gpt2 --output out/model.safetensors
//       [--dtype F32|F16|BF16] [--hf-prefix transformer.|none] [--lm-head] [--hf-config-out out/config.json]
// Name and layout mapping: model/inference/inference_load.h. hf-to-mpitron pads wte to the padded
// vocabulary (zero rows) and writes iteration 0 with zero Adam moments (load it with
// generate_text / evaluate --load, or pretrain_gpt --load --finetune); mpitron-to-hf drops
// the padding rows and transposes the Conv1D matrices back. Values are copied exactly
// (F16/BF16 inputs are widened to f32; exporting with the same --dtype gives the same bits).
#include "apps/app_main.h"
#include <mpi.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <sys/stat.h>

#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "model/inference/inference_load.h"

using namespace mpitron;
namespace po = boost::program_options;

namespace {

bool is_dir(const std::string& p) {
  struct stat s;
  return stat(p.c_str(), &s) == 0 && S_ISDIR(s.st_mode);
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MPT_CHECK(f.good(), str("cannot open ", path), "");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int run(int argc, char** argv) {
  std::string direction, input, output, hf_config, hf_config_out, dtype = "F32", prefix = "transformer.";
  int64_t heads = 0, divisible_by = 128, tp = 1;
  bool lm_head = false;
  po::options_description d("convert_checkpoint: Hugging Face GPT-2 safetensors <-> mpitron checkpoint");
  d.add_options()("help,h", "print this help")
      ("direction", po::value(&direction)->required(), "hf-to-mpitron or mpitron-to-hf")
      ("input", po::value(&input)->required(), "hf-to-mpitron: a .safetensors file (or a directory holding "
                                              "model.safetensors and config.json); mpitron-to-hf: a checkpoint directory")
      ("output", po::value(&output)->required(), "hf-to-mpitron: the checkpoint directory to create; mpitron-to-hf: "
                                                "the .safetensors file (or a directory: model.safetensors + config.json)")
      ("hf-config", po::value(&hf_config), "hf-to-mpitron: HF config.json (n_head, layer_norm_epsilon)")
      ("num-attention-heads", po::value(&heads), "hf-to-mpitron: heads, when there is no config.json")
      ("make-vocab-size-divisible-by", po::value(&divisible_by), "hf-to-mpitron: vocabulary padding (default 128)")
      ("tensor-model-parallel-size", po::value(&tp),
       "hf-to-mpitron: pad the vocabulary to a multiple of --make-vocab-size-divisible-by x this (Megatron's rule), "
       "so the checkpoint loads at this TP with the same flags (it loads under any layout; default 1)")
      ("dtype", po::value(&dtype), "mpitron-to-hf: F32 (default), F16 or BF16")
      ("hf-prefix", po::value(&prefix), "mpitron-to-hf: name prefix, \"transformer.\" (default) or \"none\"")
      ("lm-head", po::bool_switch(&lm_head), "mpitron-to-hf: also write lm_head.weight (= wte)")
      ("hf-config-out", po::value(&hf_config_out), "mpitron-to-hf: also write HF's config.json here");
  po::variables_map vm;
  if (!parse_app_flags(argc, argv, d, vm, "convert_checkpoint")) return 0;
  MPT_CHECK(tp >= 1 && tp <= (1 << 20), str("--tensor-model-parallel-size must be in [1, 1048576], got ", tp),
            "the tensor-parallel size the checkpoint will be trained at");
  MPT_CHECK(!vm.count("num-attention-heads") || heads >= 1, str("--num-attention-heads must be >= 1, got ", heads),
            "leave it out to read n_head from config.json");
  MPT_CHECK(divisible_by >= 1 && divisible_by <= (1 << 20),
            str("--make-vocab-size-divisible-by must be in [1, 1048576], got ", divisible_by), "the default is 128");
  if (direction == "hf-to-mpitron") {
    std::string st_path = input;
    if (is_dir(input)) {
      st_path = input + "/model.safetensors";
      if (hf_config.empty() && std::ifstream(input + "/config.json").good()) hf_config = input + "/config.json";
    }
    const io::Safetensors st = io::read_safetensors(st_path);
    const GPTConfig cfg = hf_gpt2_config(st, hf_config.empty() ? "" : slurp(hf_config), heads, divisible_by * tp);
    auto model = gpt_from_hf_gpt2(st, cfg);
    const std::string dir = save_model_checkpoint(output, *model, st_path);
    log_info("wrote ", dir, ": ", cfg.num_layers, " layers, hidden ", cfg.hidden_size, ", ", cfg.num_attention_heads,
             " heads, vocab ", cfg.vocab_size, " (padded ", cfg.padded_vocab_size, "), positions ",
             cfg.max_position_embeddings);
  } else if (direction == "mpitron-to-hf") {
    MPT_CHECK(dtype == "F32" || dtype == "F16" || dtype == "BF16", str("--dtype ", dtype), "use F32, F16 or BF16");
    InferenceModel m = load_model_for_inference(input);
    HfExportOptions o;
    o.prefix = prefix == "none" ? "" : prefix;
    o.dtype = dtype;
    o.lm_head = lm_head;
    std::string out = output;
    if (is_dir(output)) {
      out = output + "/model.safetensors";
      if (hf_config_out.empty()) hf_config_out = output + "/config.json";
    }
    io::write_safetensors(out, hf_gpt2_from_gpt(*m.model, o));
    if (!hf_config_out.empty()) {
      std::ofstream f(hf_config_out);
      f << hf_gpt2_config_json(m.model->config()) << "\n";
      MPT_CHECK(f.good(), str("cannot write ", hf_config_out), "");
    }
    log_info("wrote ", out, hf_config_out.empty() ? "" : " and " + hf_config_out, " from ", m.dir);
  } else {
    MPT_THROW(str("--direction ", direction, " is not known"), "use hf-to-mpitron or mpitron-to-hf");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_single_process_app(argc, argv, "convert_checkpoint", [&] { return run(argc, argv); });
}
