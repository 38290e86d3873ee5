// convert_checkpoint — Hugging Face safetensors <-> mpitron HDF5 checkpoint, GPT-2, Llama and BERT.
//   convert_checkpoint --direction hf-to-mpitron --input gpt2/ --output ckpt/gpt2
//   convert_checkpoint --direction hf-to-mpitron --input Llama-2-7b-hf/ --output ckpt/llama
//   convert_checkpoint --direction hf-to-mpitron --input bert-base-uncased/ --output ckpt/bert
//   convert_checkpoint --direction mpitron-to-hf --input ckpt/llama --output out/llama-hf/
//       [--dtype F32|F16|BF16] [--hf-prefix transformer.|none] [--lm-head] [--hf-config-out out/config.json]
// The family is detected, no flag: hf-to-mpitron reads config.json's model_type (or
// architectures): gpt2 → model/inference/inference_load.h, llama / mistral →
// model/inference/hf_llama.h, bert (BertForPreTraining) → model/inference/hf_bert.h (a
// directory: config.json + model.safetensors or a sharded model.safetensors.index.json);
// without a config.json the input is a GPT-2 .safetensors file.
// mpitron-to-hf reads the checkpoint's architecture: GPT-2, Llama (RMSNorm + SwiGLU + rope) or
// BERT (post-LN with the binary head → BertForPreTraining; the erf GELU is written as
// hidden_act "gelu", the tanh one as "gelu_new"), anything else is refused. hf-to-mpitron pads
// the vocabulary (zero rows) and writes iteration 0 with zero Adam moments (load it with
// generate_text / evaluate --load, or pretrain_gpt --load --finetune, under any TP x PP layout);
// mpitron-to-hf drops the padding rows. Values are copied
// exactly (F16/BF16 inputs are widened to f32; exporting with the same --dtype gives the same bits).
#include "apps/app_main.h"
#include <mpi.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <sys/stat.h>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/inference/hf_bert.h"
#include "model/inference/hf_llama.h"
#include "model/inference/inference_load.h"

using namespace mpitron;
namespace po = boost::program_options;

namespace {

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

bool is_dir(const std::string& p) {
  struct stat s;
  return stat(p.c_str(), &s) == 0 && S_ISDIR(s.st_mode);
}

std::string slurp(const std::string& path) {
  check_regular_file(path, "file");  // a FIFO would block the converter
  std::ifstream f(path, std::ios::binary);
  MPT_CHECK(f.good(), str("cannot open ", path), "");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int run(int argc, char** argv) {
  std::string direction, input, output, hf_config, hf_config_out, dtype = "F32", prefix = "transformer.";
  int64_t heads = 0, divisible_by = 128, tp = 1;
  bool lm_head = false, overwrite = false;
  po::options_description d("convert_checkpoint: Hugging Face GPT-2 / Llama / BERT (BertForPreTraining) safetensors "
                            "<-> mpitron checkpoint (the family is read from config.json or the checkpoint)");
  d.add_options()("help,h", "print this help")
      ("direction", po::value(&direction)->required(), "hf-to-mpitron or mpitron-to-hf")
      ("input", po::value(&input)->required(), "hf-to-mpitron: a Hugging Face model directory (config.json and model.safetensors, or "
                                              "model.safetensors.index.json and its shards; Llama and BERT need this), or a GPT-2 "
                                              ".safetensors file; mpitron-to-hf: a checkpoint directory")
      ("output", po::value(&output)->required(), "hf-to-mpitron: the checkpoint directory to create; mpitron-to-hf: "
                                                "a directory (model.safetensors + config.json; created for Llama and BERT) or, "
                                                "for GPT-2, a .safetensors file")
      ("hf-config", po::value(&hf_config), "hf-to-mpitron: HF config.json, when it is not in the --input directory")
      ("num-attention-heads", po::value(&heads), "hf-to-mpitron, GPT-2: heads, when there is no config.json")
      ("make-vocab-size-divisible-by", po::value(&divisible_by), "hf-to-mpitron: vocabulary padding (default 128)")
      ("tensor-model-parallel-size", po::value(&tp),
       "hf-to-mpitron: pad the vocabulary to a multiple of --make-vocab-size-divisible-by x this (Megatron's rule), "
       "so the checkpoint loads at this TP with the same flags (it loads under any layout; default 1)")
      ("dtype", po::value(&dtype), "mpitron-to-hf: F32 (default), F16 or BF16")
      ("hf-prefix", po::value(&prefix), "mpitron-to-hf, GPT-2: name prefix, \"transformer.\" (default) or \"none\"")
      ("lm-head", po::bool_switch(&lm_head), "mpitron-to-hf, GPT-2: also write lm_head.weight (= wte; Llama writes its own lm_head)")
      ("hf-config-out", po::value(&hf_config_out), "mpitron-to-hf: also write HF's config.json here")
      ("overwrite", po::bool_switch(&overwrite),
       "replace existing output: model.safetensors / config.json (mpitron-to-hf), or the checkpoints and "
       "latest_checkpointed_iteration.txt of a checkpoint directory (hf-to-mpitron)");
  po::variables_map vm;
  if (!parse_app_flags(argc, argv, d, vm, "convert_checkpoint")) return 0;
  MPT_CHECK(tp >= 1 && tp <= (1 << 20), str("--tensor-model-parallel-size must be in [1, 1048576], got ", tp),
            "the tensor-parallel size the checkpoint will be trained at");
  MPT_CHECK(!vm.count("num-attention-heads") || heads >= 1, str("--num-attention-heads must be >= 1, got ", heads),
            "leave it out to read n_head from config.json");
  MPT_CHECK(divisible_by >= 1 && divisible_by <= (1 << 20),
            str("--make-vocab-size-divisible-by must be in [1, 1048576], got ", divisible_by), "the default is 128");
  // Nothing this run did not write is replaced without --overwrite.
  const auto refuse_existing = [&](const std::string& path) {
    MPT_CHECK(overwrite || path.empty() || !std::filesystem::exists(path),
              str("--output: '", path, "' already exists"), "choose another --output, or pass --overwrite to replace it");
  };
  if (direction == "hf-to-mpitron") {
    MPT_CHECK(overwrite || (io::CheckpointReader::list_iterations(output).empty() &&
                            io::CheckpointReader::read_tracker(output) < 0),
              str("--output ", output, " already holds checkpoints (a training run or an earlier import); importing "
                  "would repoint its latest_checkpointed_iteration.txt"),
              "choose an empty --output directory, or pass --overwrite");
    std::string st_path = input;
    if (is_dir(input)) {
      st_path = input + "/model.safetensors";
      if (hf_config.empty() && std::ifstream(input + "/config.json").good()) hf_config = input + "/config.json";
    }
    const std::string config_text = hf_config.empty() ? "" : slurp(hf_config);
    const std::string type = config_text.empty() ? "gpt2" : hf_model_type(config_text);
    if (type != "gpt2") {
      MPT_CHECK(is_dir(input), str("--input ", input, " is a file, but a ", type, " checkpoint is read from its directory"),
                "pass the Hugging Face model directory (config.json + model.safetensors[.index.json])");
      MPT_CHECK(!vm.count("num-attention-heads"), "--num-attention-heads is for GPT-2 files without a config.json",
                str("the ", type, " config.json gives num_attention_heads; drop the flag"));
      HfCheckpoint ck = read_hf_checkpoint(input);
      ck.config_json = config_text;
      if (type == "bert") {
        const GPTConfig cfg = hf_bert_config(config_text, divisible_by * tp);
        auto model = bert_from_hf(ck, cfg);
        const std::string dir = save_model_checkpoint(output, model->core(), input);
        log_info("wrote ", dir, ": bert (post-LN, BertForPreTraining), ", cfg.num_layers, " layers, hidden ",
                 cfg.hidden_size, ", ", cfg.num_attention_heads, " heads, ffn ", cfg.ffn(), ", vocab ", cfg.vocab_size,
                 " (padded ", cfg.padded_vocab_size, "), ", cfg.num_tokentypes, " token types, ",
                 cfg.gelu_exact ? "erf" : "tanh", " GELU");
        return 0;
      }
      const GPTConfig cfg = hf_llama_config(config_text, divisible_by * tp);
      auto model = gpt_from_hf_llama(ck, cfg);
      const std::string dir = save_model_checkpoint(output, *model, input);
      log_info("wrote ", dir, ": ", type, ", ", cfg.num_layers, " layers, hidden ", cfg.hidden_size, ", ",
               cfg.num_attention_heads, " heads, ", cfg.query_groups(), " kv heads, ffn ", cfg.ffn(), ", vocab ",
               cfg.vocab_size, " (padded ", cfg.padded_vocab_size, ")", cfg.untie_embeddings ? "" : ", tied head");
      return 0;
    }
    const io::Safetensors st = io::read_safetensors(st_path);
    const GPTConfig cfg = hf_gpt2_config(st, config_text, heads, divisible_by * tp);
    auto model = gpt_from_hf_gpt2(st, cfg);
    const std::string dir = save_model_checkpoint(output, *model, st_path);
    log_info("wrote ", dir, ": ", cfg.num_layers, " layers, hidden ", cfg.hidden_size, ", ", cfg.num_attention_heads,
             " heads, vocab ", cfg.vocab_size, " (padded ", cfg.padded_vocab_size, "), positions ",
             cfg.max_position_embeddings);
  } else if (direction == "mpitron-to-hf") {
    MPT_CHECK(dtype == "F32" || dtype == "F16" || dtype == "BF16", str("--dtype ", dtype), "use F32, F16 or BF16");
    InferenceModel m = load_model_for_inference(input);
    const GPTConfig& cfg = m.model->config();
    std::string why;
    if (cfg.bert) {
      MPT_CHECK(hf_bert_exportable(cfg, &why),
                str("checkpoint ", input, " is a BERT that BertForPreTraining cannot hold: ", why),
                "mpitron-to-hf exports the original post-LN BERT with its binary head");
      MPT_CHECK(!vm.count("hf-prefix") && !lm_head, "--hf-prefix and --lm-head are GPT-2 export options",
                "a BERT export always has bert.* / cls.* names and a tied decoder");
      std::string out = output;
      if (!ends_with(output, ".safetensors")) {
        std::filesystem::create_directories(output);
        out = output + "/model.safetensors";
        if (hf_config_out.empty()) hf_config_out = output + "/config.json";
      }
      refuse_existing(out);
      refuse_existing(hf_config_out);
      io::write_safetensors(out, hf_bert_from_gpt(*m.model, dtype));
      if (!hf_config_out.empty()) write_file_checked(hf_config_out, hf_bert_config_json(cfg, dtype) + "\n", "--hf-config-out");
      log_info("wrote ", out, hf_config_out.empty() ? "" : " and " + hf_config_out, " (BertForPreTraining) from ", m.dir);
      return 0;
    }
    if (cfg.family() != "gpt2") {
      MPT_CHECK(hf_llama_exportable(cfg, &why),
                str("checkpoint ", input, " has architecture family ", cfg.family(), ", which Hugging Face has no model for: ", why),
                "mpitron-to-hf exports GPT-2 (GPT2LMHeadModel), Llama (LlamaForCausalLM) and BERT (BertForPreTraining) "
                "architectures");
      MPT_CHECK(!vm.count("hf-prefix") && !lm_head, "--hf-prefix and --lm-head are GPT-2 export options",
                "a Llama export always has model.* names and its own lm_head.weight");
      std::string out = output;
      if (!ends_with(output, ".safetensors")) {
        std::filesystem::create_directories(output);
        out = output + "/model.safetensors";
        if (hf_config_out.empty()) hf_config_out = output + "/config.json";
      }
      refuse_existing(out);
      refuse_existing(hf_config_out);
      io::write_safetensors(out, hf_llama_from_gpt(*m.model, dtype));
      if (!hf_config_out.empty()) write_file_checked(hf_config_out, hf_llama_config_json(cfg, dtype) + "\n", "--hf-config-out");
      log_info("wrote ", out, hf_config_out.empty() ? "" : " and " + hf_config_out, " (LlamaForCausalLM) from ", m.dir);
      return 0;
    }
    HfExportOptions o;
    o.prefix = prefix == "none" ? "" : prefix;
    o.dtype = dtype;
    o.lm_head = lm_head;
    std::string out = output;
    if (is_dir(output)) {
      out = output + "/model.safetensors";
      if (hf_config_out.empty()) hf_config_out = output + "/config.json";
    }
    refuse_existing(out);
    refuse_existing(hf_config_out);
    io::write_safetensors(out, hf_gpt2_from_gpt(*m.model, o));
    if (!hf_config_out.empty()) write_file_checked(hf_config_out, hf_gpt2_config_json(m.model->config()) + "\n", "--hf-config-out");
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
