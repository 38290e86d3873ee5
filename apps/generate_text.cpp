// generate_text — sample text from a checkpoint (Megatron's tools/generate_samples_gpt.py flags).
//   generate_text --load ckpt --sample-input-file prompts.txt --out-seq-length 64 --top_p 0.9 --genfile out.jsonl
//   generate_text --load ckpt --num-samples 4 --temperature 0.8 --top_k 40 --seed 7
//   generate_text --load ckpt --interactive  (stdin a terminal: prompts asked for; otherwise one prompt per stdin line)
// One input mode is required (--sample-input-file, --num-samples N >= 1 or --interactive).
// --out-seq-length is the number of NEW tokens per prompt (Megatron's meaning); a prompt plus
// --out-seq-length beyond the model's max_position_embeddings is an error, not a silent cap. Decoding uses the KV cache of model/inference/generate.h; sampling
// with the same --seed gives the same text. --greedy (or --top_k 1, or --temperature 0) is argmax.
// Output: one JSON object per sample, {"prompt", "text" (generated only), "tokens" (generated
// ids), "finished" (stopped at <|endoftext|>)}, written to --genfile or stdout.
#include "apps/app_main.h"
#include <mpi.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "data/text_tokenizer.h"
#include "model/inference/generate.h"
#include "model/inference/inference_flags.h"
#include "model/inference/inference_load.h"

using namespace mpitron;
namespace po = boost::program_options;

namespace {

struct Args {
  std::string load, sample_input_file, genfile, vocab_file, merge_file, tokenizer_type = "GPT2BPETokenizer", tokenizer_model;
  int64_t num_samples = 0, out_seq_length = 64, micro_batch_size = 8;
  bool interactive = false;
  SamplingParams sampling;
  InferenceFlags inf;  // the pretraining GPT_ARGS a Megatron generation script passes too
};

bool parse(int argc, char** argv, Args& a) {
  int64_t tp = 1, pp = 1;
  po::options_description d("generate_text: sample from a GPT checkpoint");
  d.add_options()("help,h", "print this help")
      ("load", po::value(&a.load)->required(), "checkpoint directory (pretrain_gpt --save, or convert_checkpoint output)")
      ("sample-input-file", po::value(&a.sample_input_file), "prompts, one per line (empty line: unconditional)")
      ("num-samples", po::value(&a.num_samples), "unconditional samples (no prompt file)")
      ("interactive", po::bool_switch(&a.interactive),
       "prompts from stdin: asked for on a terminal (\"stop\" ends), else one per line")
      ("out-seq-length", po::value(&a.out_seq_length), "new tokens per sample (default 64)")
      ("temperature", po::value(&a.sampling.temperature), "logits / temperature (default 1.0; 0: greedy)")
      ("top_k", po::value(&a.sampling.top_k), "sample among the k most likely tokens (default 0: all)")
      ("top_p", po::value(&a.sampling.top_p), "nucleus sampling threshold (default 0: off)")
      ("greedy", po::bool_switch(&a.sampling.greedy), "argmax decoding")
      ("seed", po::value(&a.sampling.seed), "Philox seed of the sampling (default 1234)")
      ("micro-batch-size", po::value(&a.micro_batch_size), "prompts decoded together (default 8)")
      ("genfile", po::value(&a.genfile), "write the samples as JSON lines here (default: stdout)")
      ("vocab-file", po::value(&a.vocab_file), "GPT-2 vocab (default: bundled assets/gpt2)")
      ("merge-file", po::value(&a.merge_file), "GPT-2 merges (default: bundled assets/gpt2)")
      ("tokenizer-type", po::value(&a.tokenizer_type)->default_value("GPT2BPETokenizer"), data::kTokenizerTypes)
      ("tokenizer-model", po::value(&a.tokenizer_model), "tokenizer.json (HuggingFaceTokenizer) or tokenizer.model")
      ("tensor-model-parallel-size", po::value(&tp), "must be 1: inference runs on one process (a checkpoint of any layout loads here)")
      ("pipeline-model-parallel-size", po::value(&pp), "must be 1: inference runs on one process (a checkpoint of any layout loads here)");
  add_inference_flags(d, a.inf, /*with_seq_length=*/true);
  po::variables_map vm;
  if (!parse_app_flags(argc, argv, d, vm, "generate_text")) return false;
  check_inference_flags(vm, a.inf);
  if (checkpoint_exists(a.load)) check_against_checkpoint(vm, a.inf, read_checkpoint_config(a.load), a.load);
  for (const std::string& n : a.inf.notes) std::fprintf(stderr, "%s\n", n.c_str());
  MPT_CHECK(tp == 1 && pp == 1, "generate_text runs on one process: tensor/pipeline parallel sizes must be 1",
            "checkpoints are stored unsharded, so any checkpoint loads on one process");
  MPT_CHECK(!vm.count("num-samples") || a.num_samples >= 1,
            str("--num-samples must be >= 1, got ", a.num_samples), "");
  const int modes = !a.sample_input_file.empty() + (vm.count("num-samples") > 0) + a.interactive;
  MPT_CHECK(modes == 1,
            modes == 0 ? "generate_text needs an input mode: --sample-input-file FILE, --num-samples N or --interactive"
                       : "--sample-input-file, --num-samples and --interactive exclude each other",
            "pass exactly one of them");
  MPT_CHECK(a.out_seq_length >= 1, str("--out-seq-length must be >= 1, got ", a.out_seq_length), "");
  MPT_CHECK(a.micro_batch_size >= 1, str("--micro-batch-size must be >= 1, got ", a.micro_batch_size), "");
  a.sampling.validate();
  return true;
}

class Generator {
 public:
  // out: the --genfile, or nullptr for stdout.
  Generator(const Args& a, GPT& model, const data::TextTokenizer& tok, OutputFile* out)
      : a_(a), model_(model), tok_(tok), enc_(tok.make_encoder()), out_(out) {}

  // Generates for prompts (strings) and writes one JSON line each.
  void run(const std::vector<std::string>& prompts) {
    std::vector<std::vector<int32_t>> ids;
    const int64_t P = model_.config().max_position_embeddings;
    for (const std::string& p : prompts) {
      ids.push_back(enc_->encode(p));
      const int64_t T = std::max<int64_t>(1, static_cast<int64_t>(ids.back().size()));  // empty: starts at <|endoftext|>
      MPT_CHECK(T + a_.out_seq_length <= P,
                str("prompt ", prompts_seen_ + static_cast<int64_t>(ids.size()), " (", T, " tokens) + --out-seq-length ",
                    a_.out_seq_length, " = ", T + a_.out_seq_length,
                    " tokens exceeds the model's context (max_position_embeddings ", P, ")"),
                str("lower --out-seq-length to at most ", P - T, " or shorten the prompt"));
    }
    prompts_seen_ += static_cast<int64_t>(prompts.size());
    GenerateOptions o;
    o.max_new_tokens = a_.out_seq_length;
    o.eod = tok_.eod();
    o.sampling = a_.sampling;
    o.sampling.seed = a_.sampling.seed + batches_++;  // each batch its own streams, reproducibly
    const GenerateOutput g = generate(model_, ids, o);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto& gen = g.generated[i];
      const bool finished = !gen.empty() && gen.back() == tok_.eod();
      const std::vector<int32_t> shown(gen.begin(), gen.end() - (finished ? 1 : 0));
      nlohmann::json j = {{"prompt", prompts[i]}, {"text", tok_.decode(shown)}, {"tokens", gen}, {"finished", finished}};
      const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      if (out_) out_->write(text);
      else std::cout << text;
    }
    if (out_) out_->flush();
    else MPT_CHECK(std::cout.flush().good(), "writing the samples to stdout failed", "is the disk full or the pipe closed?");
  }

 private:
  const Args& a_;
  GPT& model_;
  const data::TextTokenizer& tok_;
  std::unique_ptr<data::TextEncoder> enc_;
  OutputFile* out_;
  uint64_t batches_ = 0;
  int64_t prompts_seen_ = 0;
};

void run(const Args& a) {
  const auto tok_ptr = data::make_tokenizer({a.tokenizer_type, a.tokenizer_model, a.vocab_file, a.merge_file});
  const data::TextTokenizer& tok = *tok_ptr;
  const Device dev = cuda_available() ? Device::cuda(0) : Device::cpu();
  InferenceModel m = load_model_for_inference(a.load, dev, a.inf.dtype());
  MPT_CHECK(m.model->config().vocab_size == tok.vocab_size(),
            str("the checkpoint's vocab_size ", m.model->config().vocab_size, " differs from the tokenizer's ",
                tok.vocab_size()), "pass the tokenizer flags the model was trained with (--tokenizer-type, --tokenizer-model or --vocab-file/--merge-file)");
  std::fprintf(stderr, "loaded %s on %s\n", m.dir.c_str(), dev.name().c_str());  // stdout may carry the samples
  std::unique_ptr<OutputFile> file;
  if (!a.genfile.empty()) file = std::make_unique<OutputFile>(a.genfile, "--genfile");
  Generator g(a, *m.model, tok, file.get());
  const auto batched = [&](const std::vector<std::string>& all) {
    for (size_t i = 0; i < all.size(); i += static_cast<size_t>(a.micro_batch_size))
      g.run(std::vector<std::string>(all.begin() + static_cast<std::ptrdiff_t>(i),
                                     all.begin() + static_cast<std::ptrdiff_t>(std::min(all.size(), i + static_cast<size_t>(a.micro_batch_size)))));
  };
  if (a.num_samples > 0) {
    batched(std::vector<std::string>(static_cast<size_t>(a.num_samples), ""));
  } else if (!a.sample_input_file.empty()) {
    LineReader f(a.sample_input_file, "--sample-input-file");
    std::vector<std::string> prompts;
    for (std::string line; f.next(line);) prompts.push_back(line);
    batched(prompts);
  } else if (a.interactive && isatty(STDIN_FILENO)) {
    for (;;) {
      std::fprintf(stderr, "Context prompt (stop to exit) >>> ");
      std::string line;
      if (!std::getline(std::cin, line) || line == "stop") break;
      g.run({line});
    }
  } else {
    std::vector<std::string> prompts;
    for (std::string line; std::getline(std::cin, line);) prompts.push_back(line);
    batched(prompts);
  }
  if (file) file->close();  // a full disk shows here at the latest: exit 1, not 0
}

}  // namespace

int main(int argc, char** argv) {
  return run_single_process_app(argc, argv, "generate_text", [&] {
    Args a;
    if (parse(argc, argv, a)) run(a);
    return 0;
  });
}
