// convert_checkpoint — Hugging Face safetensors <-> mpitron HDF5 checkpoint, every family
// (GPT-2, Llama, BERT, …: docs/model-families.md "Hugging Face").
//   convert_checkpoint --direction hf-to-mpitron --input gpt2/ --output ckpt/gpt2
//   convert_checkpoint --direction hf-to-mpitron --input Llama-2-7b-hf/ --output ckpt/llama
//   convert_checkpoint --direction hf-to-mpitron --input bert-base-uncased/ --output ckpt/bert
//   convert_checkpoint --direction mpitron-to-hf --input ckpt/llama --output out/llama-hf/
//   convert_checkpoint --direction megatron-to-mpitron --input megatron_run/ --output ckpt/run
//       (a Megatron-LM torch or torch_dist directory; the weights only: pretrain_gpt --load
//       resumes the directory itself with its optimizer, docs/checkpoint-format.md)
//   convert_checkpoint --direction mpitron-to-megatron --input ckpt/run --output megatron_run/
//       [--target-tensor-parallel-size 2] [--target-pipeline-model-parallel-size 2]
//       (Megatron-LM's legacy torch format, model only: Megatron-LM loads it with --ckpt-format torch
//       --no-load-optim --no-load-rng, or --finetune; model/checkpoint/megatron_save.h)
//       [--dtype F32|F16|BF16] [--hf-prefix transformer.|none] [--lm-head] [--hf-config-out out/config.json]
// The family is detected, no flag: hf-to-mpitron reads config.json's model_type (or
// architectures) and takes the family's row of model/families.h; without a config.json the
// input is a GPT-2 .safetensors file. mpitron-to-hf reads the checkpoint's architecture and
// exports the family it is; a mix no family has is refused naming the flags it lacks. One
// converter does both (model/inference/hf_convert.h). hf-to-mpitron pads the vocabulary
// (zero rows) and writes iteration 0 with zero Adam moments (load it with generate_text /
// evaluate --load, or pretrain_gpt --load --finetune, under any TP x PP layout); mpitron-to-hf
// drops the padding rows. Values are copied exactly (F16/BF16 inputs are widened to f32;
// exporting with the same --dtype gives the same bits).
#include "apps/app_main.h"
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>
#include <sys/stat.h>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/checkpoint/checkpoint_config.h"
#include "model/checkpoint/megatron_checkpoint.h"
#include "model/checkpoint/megatron_save.h"
#include "model/families.h"
#include "model/inference/hf_convert.h"
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

// The Hugging Face weight files of a model directory, of either layout (one model.safetensors, or an
// index and its shards; PyTorch's pytorch_model*.bin alike): an export beside an older one would leave
// a mix that transformers reads wrongly (it prefers the index).
std::vector<std::string> hf_weight_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    const bool weights = (n.rfind("model", 0) == 0 && (ends_with(n, ".safetensors") || ends_with(n, ".safetensors.index.json"))) ||
                         (n.rfind("pytorch_model", 0) == 0 && (ends_with(n, ".bin") || ends_with(n, ".bin.index.json")));
    if (weights) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int run(int argc, char** argv) {
  std::string direction, input, output, hf_config, hf_config_out, dtype = "F32", prefix = "transformer.";
  int64_t heads = 0, divisible_by = 128, tp = 1, target_tp = 1, target_pp = 1;
  std::string tokenizer_type = "GPT2BPETokenizer";
  bool lm_head = false, overwrite = false;
  po::options_description d("convert_checkpoint: Hugging Face GPT-2 / Llama / BERT (BertForPreTraining) / T5 (T5ForConditionalGeneration) safetensors "
                            "<-> mpitron checkpoint (the family is read from config.json or the checkpoint)");
  d.add_options()("help,h", "print this help")
      ("direction", po::value(&direction)->required(),
       "hf-to-mpitron, mpitron-to-hf, megatron-to-mpitron or mpitron-to-megatron")
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
      ("target-tensor-parallel-size", po::value(&target_tp),
       "mpitron-to-megatron: the tensor-parallel size of the Megatron checkpoint written (default 1)")
      ("target-pipeline-model-parallel-size", po::value(&target_pp),
       "mpitron-to-megatron: the pipeline-parallel size of the Megatron checkpoint written (default 1)")
      ("tokenizer-type", po::value(&tokenizer_type),
       "mpitron-to-megatron: the tokenizer_type recorded in Megatron's args (default GPT2BPETokenizer)")
      ("dtype", po::value(&dtype), "mpitron-to-hf: F32 (default), F16 or BF16")
      ("hf-prefix", po::value(&prefix), "mpitron-to-hf, GPT-2: name prefix, \"transformer.\" (default) or \"none\"")
      ("lm-head", po::bool_switch(&lm_head), "mpitron-to-hf, GPT-2: also write lm_head.weight (= wte; Llama writes its own lm_head)")
      ("hf-config-out", po::value(&hf_config_out), "mpitron-to-hf: also write HF's config.json here")
      ("overwrite", po::bool_switch(&overwrite),
       "replace existing output: the Hugging Face weights of either layout (model.safetensors, or an index and "
       "its shards: all removed) and config.json (mpitron-to-hf), or the checkpoints and "
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
    std::string file = input;  // a bare GPT-2 .safetensors file, or a model directory
    if (is_dir(input) && hf_config.empty() && std::ifstream(input + "/config.json").good()) hf_config = input + "/config.json";
    const std::string config_text = hf_config.empty() ? "" : slurp(hf_config);
    HfCheckpoint ck;
    GPTConfig cfg;
    if (config_text.empty() || !is_dir(input)) {  // GPT-2: one file, sizes from config.json or the shapes
      if (is_dir(input)) file = input + "/model.safetensors";
      ck = hf_checkpoint_of_file(file, config_text);
      cfg = hf_file_config(ck.tensors, config_text, heads, divisible_by * tp);  // refuses a family read from a directory
    } else {
      ck = read_hf_checkpoint(input);
      ck.config_json = config_text;
      cfg = mpitron::hf_config(config_text, divisible_by * tp);
      MPT_CHECK(heads == 0 || heads == cfg.num_attention_heads,
                str("--num-attention-heads ", heads, " contradicts the HF config.json's ", cfg.num_attention_heads,
                    " heads"),
                "drop --num-attention-heads: config.json gives the heads (the flag is for GPT-2 files without one)");
    }
    std::string dir;
    if (cfg.bert) dir = save_model_checkpoint(output, bert_from_hf(ck, cfg)->core(), input);
    else if (cfg.t5) dir = save_model_checkpoint(output, t5_from_hf(ck, cfg)->core(), input);
    else dir = save_model_checkpoint(output, *gpt_from_hf(ck, cfg), input);
    log_info("wrote ", dir, ": ", cfg.family(), ", ",
             cfg.t5 ? str(cfg.encoder_num_layers, " encoder + ", cfg.decoder_num_layers(), " decoder") : str(cfg.num_layers),
             " layers, hidden ", cfg.hidden_size, ", ",
             cfg.num_attention_heads, " heads, ", cfg.query_groups(), " kv heads, head dim ", cfg.head_dim(), ", ffn ",
             cfg.ffn(), ", vocab ", cfg.vocab_size, " (padded ", cfg.padded_vocab_size, "), positions ",
             cfg.max_position_embeddings, cfg.untie_embeddings ? "" : ", tied head", ", MLP ", to_string(cfg.mlp));
  } else if (direction == "mpitron-to-hf") {
    MPT_CHECK(dtype == "F32" || dtype == "F16" || dtype == "BF16", str("--dtype ", dtype), "use F32, F16 or BF16");
    InferenceModel m = load_model_for_inference(input);
    const GPTConfig& cfg = m.model->config();
    std::string why;
    MPT_CHECK(hf_exportable(cfg, &why),
              str("checkpoint ", input, " has architecture family ", cfg.family(), ", which Hugging Face has no model for: ",
                  why),
              "mpitron-to-hf exports the families of docs/model-families.md");
    const Family& fam = find_family(cfg.family());
    HfExportOptions o;
    o.dtype = dtype;
    if (vm.count("hf-prefix")) {
      MPT_CHECK(fam.hf_prefixes.size() > 1, str("--hf-prefix: a ", fam.hf_class, " has one tensor naming"),
                "drop --hf-prefix (it chooses GPT-2's transformer. or GPT2Model names)");
      o.prefix = prefix == "none" ? "" : prefix;
    }
    MPT_CHECK(!lm_head || fam.hf_lm_head_copy, str("--lm-head: a ", fam.hf_class, " writes its head as transformers does"),
              "drop --lm-head (it adds GPT-2's copy of the tied wte)");
    o.lm_head = lm_head;
    std::string out = output;
    if (!ends_with(output, ".safetensors")) {
      std::filesystem::create_directories(output);
      out = output + "/model.safetensors";
      if (hf_config_out.empty()) hf_config_out = output + "/config.json";
      const std::vector<std::string> old = hf_weight_files(output);
      std::string names;
      for (const std::string& n : old) names += (names.empty() ? "" : ", ") + n;
      MPT_CHECK(overwrite || old.empty(),
                str("--output ", output, " already holds Hugging Face weights (", names, ")"),
                "choose another --output, or pass --overwrite to replace them (every weight file there is removed)");
      for (const std::string& n : old) {  // --overwrite: no stale shard or index is left beside the new file
        std::filesystem::remove(output + "/" + n);
        log_info("--overwrite: removed ", output, "/", n);
      }
    }
    refuse_existing(out);
    refuse_existing(hf_config_out);
    io::write_safetensors(out, hf_from_gpt(*m.model, o));
    if (!hf_config_out.empty()) write_file_checked(hf_config_out, hf_config_json(cfg, dtype) + "\n", "--hf-config-out");
    log_info("wrote ", out, hf_config_out.empty() ? "" : " and " + hf_config_out, " (", fam.hf_class, ") from ", m.dir);
  } else if (direction == "megatron-to-mpitron") {
    MPT_CHECK(overwrite || (io::CheckpointReader::list_iterations(output).empty() &&
                            io::CheckpointReader::read_tracker(output) < 0),
              str("--output ", output, " already holds checkpoints"), "choose an empty --output directory, or pass --overwrite");
    MPT_CHECK(detect_megatron_checkpoint(input).format != MegatronFormat::None,
              str("--input ", input, " is not a Megatron-LM checkpoint directory (latest_checkpointed_iteration.txt + "
                  "iter_XXXXXXX/ with mp_rank_* or metadata.json)"),
              "");
    GPT model(megatron_config(input), Device::cpu());
    LoadOptions lo;
    lo.finetune = true;
    load_weights(input, model, lo);
    const std::string dir = save_model_checkpoint(output, model, input);
    log_info("wrote ", dir, " (the weights of ", input, ")");
  } else if (direction == "mpitron-to-megatron") {
    MPT_CHECK(target_tp >= 1 && target_tp <= 4096 && target_pp >= 1 && target_pp <= 4096,
              str("--target-tensor-parallel-size ", target_tp, " / --target-pipeline-model-parallel-size ", target_pp,
                  " out of [1, 4096]"),
              "the layout Megatron-LM will load the checkpoint at");
    MPT_CHECK(overwrite || io::CheckpointReader::read_tracker(output) < 0,
              str("--output ", output, " already holds a checkpoint (latest_checkpointed_iteration.txt)"),
              "choose an empty --output directory, or pass --overwrite");
    MPT_CHECK(detect_megatron_checkpoint(input).format == MegatronFormat::None,
              str("--input ", input, " is already a Megatron checkpoint"), "give an mpitron checkpoint directory");
    GPT model(read_checkpoint_config(input), Device::cpu());
    TrainState st;
    MPT_CHECK(load_weights(input, model, {}, &st), str("--input ", input, " holds no checkpoint"),
              "give a directory written by pretrain_gpt --save or convert_checkpoint");
    MegatronSaveOptions so;
    so.tp = target_tp;
    so.pp = target_pp;
    so.make_vocab_size_divisible_by = divisible_by;
    so.tokenizer_type = tokenizer_type;
    so.overwrite = overwrite;
    const MegatronSaved saved = save_megatron_checkpoint(model, st, output, so);
    log_info("wrote ", saved.iter_dir, " (Megatron-LM --ckpt-format torch, model only: load it with --no-load-optim "
             "--no-load-rng, or --finetune) from ", input);
  } else if (direction == "deepspeed-to-mpitron") {
    MPT_THROW(str("--direction ", direction, " is not built yet"),
              "convert the weights with DeepSpeed's zero_to_fp32.py and transformers' save_pretrained, then "
              "--direction hf-to-mpitron");
  } else {
    MPT_THROW(str("--direction ", direction, " is not known"),
              "use hf-to-mpitron, mpitron-to-hf, megatron-to-mpitron or mpitron-to-megatron");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_single_process_app(argc, argv, "convert_checkpoint", [&] { return run(argc, argv); });
}
