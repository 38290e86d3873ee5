// generate_text — sample text from a checkpoint (Megatron's tools/generate_samples_gpt.py flags).
//   generate_text --load ckpt --sample-input-file prompts.txt --out-seq-length 64 --top_p 0.9 --genfile out.jsonl
//   generate_text --load ckpt --num-samples 4 --temperature 0.8 --top_k 40 --seed 7
//   generate_text --load ckpt --interactive  (stdin a terminal: prompts asked for; otherwise one prompt per stdin line)
//   mpirun -np 4 generate_text --load ckpt ... --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
// One input mode is required (--sample-input-file, --num-samples N >= 1 or --interactive).
// --out-seq-length is the number of NEW tokens per prompt (Megatron's meaning); a prompt plus
// --out-seq-length beyond the model's max_position_embeddings is an error, not a silent cap.
// Decoding: the dynamic engine over the paged KV cache (model/inference/dynamic_engine.h),
// --micro-batch-size prompts in flight (or --inference-dynamic-batching-max-requests). Prompt i
// samples from philox(--seed, i, step): the same --seed gives the same text whatever the batch
// size and layout. --greedy (or --top_k 1, or --temperature 0) is argmax.
// Output: one JSON object per sample, {"prompt", "text" (generated only), "tokens" (generated
// ids), "finished" (stopped at <|endoftext|>)}, written (by rank 0) to --genfile or stdout.
// Every pretraining flag of a Megatron script is accepted (model/training/inference_flags.h).
#include "apps/app_main.h"
#include <mpi.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "data/text_tokenizer.h"
#include "model/inference/dynamic_engine.h"
#include "model/training/inference_flags.h"
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
      ("tokenizer-model", po::value(&a.tokenizer_model), "tokenizer.json (HuggingFaceTokenizer) or tokenizer.model");
  add_inference_flags(d, a.inf, /*with_seq_length=*/true);
  po::variables_map vm;
  if (!parse_app_flags(argc, argv, d, vm, "generate_text", /*megatron=*/true)) return false;
  check_inference_flags(vm, a.inf);
  if (checkpoint_exists(a.load)) check_against_checkpoint(vm, a.inf, read_checkpoint_config(a.load), a.load);
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

// Rank 0: prompts in, JSON lines out, through the engine.
class Generator {
 public:
  Generator(const Args& a, DynamicEngine& engine, const GPTConfig& cfg, const data::TextTokenizer& tok,
            OutputFile* out)  // out: the --genfile, or nullptr for stdout
      : a_(a), engine_(engine), cfg_(cfg), tok_(tok), enc_(tok.make_encoder()), out_(out) {}

  // Generates for prompts (strings) and writes one JSON line each, in order.
  void run(const std::vector<std::string>& prompts) {
    std::vector<GenRequest> rs;
    const int64_t P = cfg_.max_position_embeddings;
    for (const std::string& p : prompts) {
      GenRequest r;
      r.prompt = enc_->encode(p);
      const int64_t T = std::max<int64_t>(1, static_cast<int64_t>(r.prompt.size()));  // empty: starts at <|endoftext|>
      MPT_CHECK(T + a_.out_seq_length <= P,
                str("prompt ", seen_ + static_cast<int64_t>(rs.size()) + 1, " (", T, " tokens) + --out-seq-length ",
                    a_.out_seq_length, " = ", T + a_.out_seq_length,
                    " tokens exceeds the model's context (max_position_embeddings ", P, ")"),
                str("lower --out-seq-length to at most ", P - T, " or shorten the prompt"));
      r.max_new_tokens = a_.out_seq_length;
      r.eod = tok_.eod();
      r.sampling = a_.sampling;
      r.stream = static_cast<uint64_t>(seen_ + static_cast<int64_t>(rs.size()));  // the prompt's index: its own draws
      rs.push_back(std::move(r));
    }
    seen_ += static_cast<int64_t>(prompts.size());
    const std::vector<GenResult> g = engine_.run(rs);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto& gen = g[i].generated;
      const bool finished = g[i].finish_reason == "stop";
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
  DynamicEngine& engine_;
  const GPTConfig& cfg_;
  const data::TextTokenizer& tok_;
  std::unique_ptr<data::TextEncoder> enc_;
  OutputFile* out_;
  int64_t seen_ = 0;
};

void drive(const Args& a, ModelRunner& runner, DynamicEngine& engine, const data::TextTokenizer& tok) {
  std::unique_ptr<OutputFile> file;
  if (!a.genfile.empty()) file = std::make_unique<OutputFile>(a.genfile, "--genfile");
  Generator g(a, engine, runner.config(), tok, file.get());
  if (a.num_samples > 0) {
    g.run(std::vector<std::string>(static_cast<size_t>(a.num_samples), ""));
  } else if (!a.sample_input_file.empty()) {
    LineReader f(a.sample_input_file, "--sample-input-file");
    std::vector<std::string> prompts;
    for (std::string line; f.next(line);) prompts.push_back(line);
    g.run(prompts);
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
    g.run(prompts);
  }
  if (file) file->close();  // a full disk shows here at the latest: exit 1, not 0
  std::fprintf(stderr, "%s\n", engine.stats().line().c_str());  // stdout may carry the samples
}

int run(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, a)) return 0;
  ModelRunner runner(MPI_COMM_WORLD, a.load, a.inf.runner());
  if (runner.is_driver())
    for (const std::string& n : a.inf.notes) std::fprintf(stderr, "%s\n", n.c_str());
  const auto tok_ptr = data::make_tokenizer({a.tokenizer_type, a.tokenizer_model, a.vocab_file, a.merge_file});
  const data::TextTokenizer& tok = *tok_ptr;
  MPT_CHECK(runner.config().vocab_size == tok.vocab_size(),
            str("the checkpoint's vocab_size ", runner.config().vocab_size, " differs from the tokenizer's ",
                tok.vocab_size()),
            "pass the tokenizer flags the model was trained with (--tokenizer-type, --tokenizer-model or --vocab-file/--merge-file)");
  const DynamicBatchingFlags& b = a.inf.batching;
  const int64_t max_requests = b.max_requests > 0 ? b.max_requests : a.micro_batch_size;
  runner.init_kv_cache(kv_cache_blocks(b, runner, max_requests), b.block_size);
  if (!runner.is_driver()) {
    runner.serve();
    return 0;
  }
  std::fprintf(stderr, "loaded %s on %s\n", runner.checkpoint_dir().c_str(), runner.describe().c_str());  // stdout may carry the samples
  DynamicEngine engine(runner, EngineConfig{max_requests, b.max_tokens, b.chunked_prefill});
  drive(a, runner, engine, tok);
  runner.stop_workers();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_inference_app(argc, argv, [&] { return run(argc, argv); });
}
