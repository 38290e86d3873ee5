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
// Every pretraining flag of a Megatron script is accepted (model/flags/inference_flags.h).
// --sample-input-ids-file FILE: prompts as token ids (one prompt a line, ids separated by spaces); the
// tokenizer is then optional ("text" is null without one).
// T5 (a pretrain_t5 --save or convert_checkpoint hf-to-mpitron directory): each prompt is the ENCODER's
// input and the output the decoder's greedy tokens (T5::greedy on the cached decoder), from --decoder-start-token-id to
// --eos-token-id; one process, greedy only, no --num-samples (docs/generate-eval.md).
#include "apps/app_main.h"
#include <mpi.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "core/device.h"
#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "data/text_tokenizer.h"
#include "data/tokenizer.h"  // find_invalid_utf8
#include "io/checkpoint.h"
#include "model/inference/dynamic_engine.h"
#include "model/flags/inference_flags.h"
#include "model/inference/runner_flags.h"
#include "model/training/pretrain_flags.h"
#include "model/inference/inference_load.h"
#include "model/inference/t5_engine.h"  // t5_tokens, load_t5_for_inference
#include "model/t5.h"
#include "parallel/communicator.h"

using namespace mpitron;
namespace po = boost::program_options;

namespace {

struct Args {
  std::string load, sample_input_file, sample_input_ids_file, genfile, vocab_file, merge_file,
      tokenizer_type = "GPT2BPETokenizer", tokenizer_model;
  int64_t num_samples = 0, out_seq_length = 64, micro_batch_size = 8, vocab_extra_ids = 0;
  int64_t decoder_start_token_id = -1, eos_token_id = -1;  // -1: the defaults (see the help)
  bool interactive = false;
  bool tokenizer_given = false;  // any tokenizer flag given (else --sample-input-ids-file runs without one)
  bool t5 = false;               // the checkpoint holds a T5
  SamplingParams sampling;
  InferenceFlags inf;  // the pretraining GPT_ARGS a Megatron generation script passes too
  data::TokenizerSpec spec() const {
    data::TokenizerSpec s{tokenizer_type, tokenizer_model, vocab_file, merge_file};
    s.vocab_extra_ids = vocab_extra_ids;
    return s;
  }
  // Without a tokenizer only with --sample-input-ids-file and no tokenizer flag.
  bool uses_tokenizer() const { return sample_input_ids_file.empty() || tokenizer_given; }
};

// What T5 takes of the flags: one process (or --tensor-model-parallel-size ranks reading a prompt file),
// greedy, an encoder input per prompt.
void check_t5_flags(const po::variables_map& vm, const Args& a) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPT_CHECK(world == a.inf.tp && a.inf.pp == 1,
            str("generate_text with the T5 checkpoint ", a.load, " runs on one process, or on --tensor-model-parallel-size "
                "ranks; it was started on ", world, " ranks (--tensor-model-parallel-size ", a.inf.tp,
                ", --pipeline-model-parallel-size ", a.inf.pp, ")"),
            "run it without mpirun, or under mpirun -np N with --tensor-model-parallel-size N (no pipeline parallelism)");
  MPT_CHECK(world == 1 || !a.interactive,
            str("--interactive with the T5 checkpoint ", a.load, " under mpirun: every rank decodes every prompt"),
            "give the prompts in a file (--sample-input-file or --sample-input-ids-file), or run one process");
  MPT_CHECK(!vm.count("num-samples"),
            str("--num-samples with the T5 checkpoint ", a.load, ": an encoder-decoder needs an input to decode from"),
            "pass prompts with --sample-input-file, --sample-input-ids-file or --interactive");
  const auto refuse = [&](const char* flag, bool greedy_value) {
    MPT_CHECK(!vm.count(flag) || greedy_value,
              str("--", flag, " with the T5 checkpoint ", a.load, ": T5 decodes greedily only (T5::greedy)"),
              str("drop --", flag, " (or pass --greedy)"));
  };
  refuse("temperature", a.sampling.temperature == 0.0f);
  refuse("top_k", a.sampling.top_k == 1);
  refuse("top_p", a.sampling.top_p == 0.0f);
}

bool parse(int argc, char** argv, Args& a) {
  po::options_description d("generate_text: sample from a GPT checkpoint, or greedy-decode a T5's");
  d.add_options()("help,h", "print this help")
      ("load", po::value(&a.load)->required(), "checkpoint directory (pretrain_gpt / pretrain_t5 --save, or convert_checkpoint output)")
      ("sample-input-file", po::value(&a.sample_input_file), "prompts, one per line (empty line: unconditional)")
      ("sample-input-ids-file", po::value(&a.sample_input_ids_file),
       "prompts as token ids, one prompt per line, ids separated by spaces (tokenizer optional: without one \"text\" is null)")
      ("num-samples", po::value(&a.num_samples), "unconditional samples (no prompt file; not for T5)")
      ("interactive", po::bool_switch(&a.interactive),
       "prompts from stdin: asked for on a terminal (\"stop\" ends), else one per line")
      ("out-seq-length", po::value(&a.out_seq_length), "new tokens per sample (default 64)")
      ("temperature", po::value(&a.sampling.temperature), "logits / temperature (default 1.0; 0: greedy)")
      ("top_k", po::value(&a.sampling.top_k), "sample among the k most likely tokens (default 0: all)")
      ("top_p", po::value(&a.sampling.top_p), "nucleus sampling threshold (default 0: off)")
      ("greedy", po::bool_switch(&a.sampling.greedy), "argmax decoding (T5 always decodes greedily)")
      ("seed", po::value(&a.sampling.seed), "Philox seed of the sampling (default 1234)")
      ("micro-batch-size", po::value(&a.micro_batch_size), "prompts decoded together (default 8)")
      ("genfile", po::value(&a.genfile), "write the samples as JSON lines here (default: stdout)")
      ("vocab-file", po::value(&a.vocab_file), "GPT-2 vocab (default: bundled assets/gpt2), or the WordPiece vocab.txt")
      ("merge-file", po::value(&a.merge_file), "GPT-2 merges (default: bundled assets/gpt2)")
      ("tokenizer-type", po::value(&a.tokenizer_type)->default_value("GPT2BPETokenizer"), data::kTokenizerTypes)
      ("tokenizer-model", po::value(&a.tokenizer_model), "tokenizer.json (HuggingFaceTokenizer) or tokenizer.model")
      ("vocab-extra-ids", po::value(&a.vocab_extra_ids),
       "<extra_id_j> sentinels appended to a WordPiece vocab (pretrain_t5's; must match the checkpoint's tokenizer)")
      ("decoder-start-token-id", po::value(&a.decoder_start_token_id),
       "T5: the decoder's first token (default: [BOS] with --vocab-extra-ids, else 0 as Hugging Face's T5)")
      ("eos-token-id", po::value(&a.eos_token_id),
       "the token that ends a sample (default: the tokenizer's end of document; T5: [EOS] with --vocab-extra-ids, else 1)");
  add_inference_flags(d, a.inf, /*with_seq_length=*/true, pretrain_flag_descriptions());
  po::variables_map vm;
  if (!parse_app_flags(argc, argv, d, vm, "generate_text", /*megatron=*/true)) return false;
  check_inference_flags(vm, a.inf);
  a.tokenizer_given = !vm["tokenizer-type"].defaulted() || vm.count("vocab-file") || vm.count("merge-file") ||
                      vm.count("tokenizer-model") || vm.count("vocab-extra-ids");
  if (checkpoint_exists(a.load)) {
    const GPTConfig ck = read_checkpoint_config(a.load);
    a.t5 = ck.t5;
    if (a.t5) check_t5_flags(vm, a);
    check_against_checkpoint(vm, a.inf, ck, a.load, /*allow_t5=*/a.t5);
  }
  // -1 stands for "the default" inside: an explicit negative id is refused, not replaced by the default.
  for (const auto& [flag, id] : {std::pair<const char*, int64_t>{"decoder-start-token-id", a.decoder_start_token_id},
                                 {"eos-token-id", a.eos_token_id}})
    MPT_CHECK(!vm.count(flag) || id >= 0, str("--", flag, " must be a token id >= 0, got ", id),
              "leave it out for the default (see --help)");
  MPT_CHECK(a.t5 || !vm.count("decoder-start-token-id"),
            str("--decoder-start-token-id: checkpoint ", a.load, " is not an encoder-decoder (T5)"),
            "drop it: a GPT continues the prompt");
  MPT_CHECK(!vm.count("num-samples") || a.num_samples >= 1,
            str("--num-samples must be >= 1, got ", a.num_samples), "");
  const int modes = !a.sample_input_file.empty() + !a.sample_input_ids_file.empty() + (vm.count("num-samples") > 0) +
                    a.interactive;
  MPT_CHECK(modes == 1,
            modes == 0 ? "generate_text needs an input mode: --sample-input-file FILE, --sample-input-ids-file FILE, "
                         "--num-samples N or --interactive"
                       : "--sample-input-file, --sample-input-ids-file, --num-samples and --interactive exclude each other",
            "pass exactly one of them");
  MPT_CHECK(a.out_seq_length >= 1, str("--out-seq-length must be >= 1, got ", a.out_seq_length), "");
  MPT_CHECK(a.micro_batch_size >= 1, str("--micro-batch-size must be >= 1, got ", a.micro_batch_size), "");
  MPT_CHECK(a.vocab_extra_ids >= 0, str("--vocab-extra-ids must be >= 0, got ", a.vocab_extra_ids), "");
  a.sampling.validate();
  return true;
}

// A prompt: its text (as given: a line of the file, or the ids line) and its token ids.
struct Prompt {
  std::string text;
  std::vector<int32_t> ids;
};

// The prompt of one --sample-input-ids-file line: ids in [0, vocab) separated by spaces.
Prompt ids_prompt(const std::string& line, const std::string& where, int64_t vocab) {
  Prompt p{line, {}};
  std::istringstream in(line);
  std::string w;
  while (in >> w) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MPT_CHECK(used == w.size() && id >= 0 && id < vocab,
              str(where, ": '", w, "' is not a token id in [0, ", vocab, ") (the checkpoint's vocabulary)"),
              "--sample-input-ids-file holds one prompt per line, token ids separated by spaces");
    p.ids.push_back(static_cast<int32_t>(id));
  }
  MPT_CHECK(!p.ids.empty(), str(where, ": an empty prompt"),
            "--sample-input-ids-file needs at least one id on each line");
  return p;
}

// The JSON lines, to --genfile or stdout.
class Sink {
 public:
  explicit Sink(const std::string& genfile) {
    if (!genfile.empty()) file_ = std::make_unique<OutputFile>(genfile, "--genfile");
  }
  void write(const std::string& prompt, const data::TextTokenizer* tok, const std::vector<int32_t>& gen, bool finished) {
    const std::vector<int32_t> shown(gen.begin(), gen.end() - (finished ? 1 : 0));
    nlohmann::json j = {{"prompt", prompt},
                        {"text", tok ? nlohmann::json(tok->decode(shown)) : nlohmann::json(nullptr)},
                        {"tokens", gen},
                        {"finished", finished}};
    const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (file_) file_->write(text);
    else std::cout << text;
  }
  void flush() {
    if (file_) file_->flush();
    else MPT_CHECK(std::cout.flush().good(), "writing the samples to stdout failed", "is the disk full or the pipe closed?");
  }
  void close() {
    if (file_) file_->close();  // a full disk shows here at the latest: exit 1, not 0
  }

 private:
  std::unique_ptr<OutputFile> file_;
};

// Feeds the prompts of the input mode to `gen`, a batch at a time (the whole file, or one
// terminal line). tok: null only with --sample-input-ids-file.
void drive(const Args& a, const data::TextTokenizer* tok, int64_t vocab,
           const std::function<void(const std::vector<Prompt>&)>& gen) {
  std::unique_ptr<data::TextEncoder> enc = tok ? tok->make_encoder() : nullptr;
  // The one check of a text prompt, whatever the model kind (a GPT's BPE refused invalid UTF-8 where a
  // T5's WordPiece decoded it into replacement characters): refused naming the input and the line.
  int64_t stdin_line = 0;
  const auto text = [&](const std::string& line, const std::string& where) {
    const int64_t bad = data::find_invalid_utf8(line);
    MPT_CHECK(bad < 0, str(where, ": the prompt is not valid UTF-8 (byte ", bad, ")"), "convert the prompts to UTF-8");
    return Prompt{line, enc->encode(line)};
  };
  std::vector<Prompt> prompts;
  if (a.num_samples > 0) {
    gen(std::vector<Prompt>(static_cast<size_t>(a.num_samples)));
  } else if (!a.sample_input_ids_file.empty()) {
    LineReader f(a.sample_input_ids_file, "--sample-input-ids-file");
    for (std::string line; f.next(line);) prompts.push_back(ids_prompt(line, f.where(), vocab));
    gen(prompts);
  } else if (!a.sample_input_file.empty()) {
    LineReader f(a.sample_input_file, "--sample-input-file");
    for (std::string line; f.next(line);) prompts.push_back(text(line, f.where()));
    gen(prompts);
  } else if (a.interactive && isatty(STDIN_FILENO)) {
    for (;;) {
      std::fprintf(stderr, "Context prompt (stop to exit) >>> ");
      std::string line;
      if (!std::getline(std::cin, line) || line == "stop") break;
      gen({text(line, str("stdin line ", ++stdin_line))});
    }
  } else {
    for (std::string line; std::getline(std::cin, line);) prompts.push_back(text(line, str("stdin line ", ++stdin_line)));
    gen(prompts);
  }
}

// Rank 0: prompts in, JSON lines out, through the engine.
class Generator {
 public:
  Generator(const Args& a, DynamicEngine& engine, const GPTConfig& cfg, const data::TextTokenizer* tok, Sink& out)
      : a_(a), engine_(engine), cfg_(cfg), tok_(tok), out_(out) {}

  // Generates for the prompts and writes one JSON line each, in order.
  void run(const std::vector<Prompt>& prompts) {
    std::vector<GenRequest> rs;
    const int64_t P = cfg_.max_position_embeddings;
    for (const Prompt& p : prompts) {
      GenRequest r;
      r.prompt = p.ids;
      const int64_t T = std::max<int64_t>(1, static_cast<int64_t>(r.prompt.size()));  // empty: starts at <|endoftext|>
      MPT_CHECK(T + a_.out_seq_length <= P,
                str("prompt ", seen_ + static_cast<int64_t>(rs.size()) + 1, " (", T, " tokens) + --out-seq-length ",
                    a_.out_seq_length, " = ", T + a_.out_seq_length,
                    " tokens exceeds the model's context (max_position_embeddings ", P, ")"),
                str("lower --out-seq-length to at most ", P - T, " or shorten the prompt"));
      r.max_new_tokens = a_.out_seq_length;
      // The stop token: --eos-token-id, else the tokenizer's end of document; none without either.
      r.eod = static_cast<int32_t>(a_.eos_token_id >= 0 ? a_.eos_token_id : tok_ ? tok_->eod() : 0);
      r.stop_at_eod = a_.eos_token_id >= 0 || tok_;
      r.sampling = a_.sampling;
      r.stream = static_cast<uint64_t>(seen_ + static_cast<int64_t>(rs.size()));  // the prompt's index: its own draws
      rs.push_back(std::move(r));
    }
    seen_ += static_cast<int64_t>(prompts.size());
    const std::vector<GenResult> g = engine_.run(rs);
    for (size_t i = 0; i < prompts.size(); ++i)
      out_.write(prompts[i].text, tok_, g[i].generated, g[i].finish_reason == "stop");
    out_.flush();
  }

 private:
  const Args& a_;
  DynamicEngine& engine_;
  const GPTConfig& cfg_;
  const data::TextTokenizer* tok_;
  Sink& out_;
  int64_t seen_ = 0;
};

// The tokenizer of the flags (null without one: --sample-input-ids-file and no tokenizer flag),
// checked against the checkpoint: its recorded tokenizer identity when it has one, the vocabulary size.
// (The identity is compared for T5 only so far; a GPT's tokenizer is checked by its size.)
std::unique_ptr<data::TextTokenizer> checked_tokenizer(const Args& a, const GPTConfig& cfg) {
  if (!a.uses_tokenizer()) return nullptr;
  auto tok = data::make_tokenizer(a.spec());
  const io::CheckpointReader r = io::CheckpointReader::open_latest(a.load);
  if (cfg.t5 && r.found() && r.has_attr("tokenizer_identity") && !r.attr_string("tokenizer_identity").empty()) {
    const nlohmann::json saved = nlohmann::json::parse(r.attr_string("tokenizer_identity"));
    const nlohmann::json now = data::tokenizer_identity(a.spec(), *tok);
    const std::string diff = data::tokenizer_difference(saved, now);
    MPT_CHECK(diff.empty(),
              str("checkpoint ", r.path(), " was trained with another tokenizer (", diff, "): the checkpoint's is ",
                  data::describe_tokenizer_identity(saved), "; the flags give ", data::describe_tokenizer_identity(now)),
              "pass the tokenizer flags the model was trained with (--tokenizer-type, --vocab-file, --vocab-extra-ids, ...)");
  }
  MPT_CHECK(cfg.vocab_size == tok->vocab_size(),
            str("the checkpoint's vocab_size ", cfg.vocab_size, " differs from the tokenizer's ", tok->vocab_size()),
            "pass the tokenizer flags the model was trained with (--tokenizer-type, --tokenizer-model, "
            "--vocab-file/--merge-file, --vocab-extra-ids), or give token ids with --sample-input-ids-file");
  return tok;
}

// T5: each prompt is the encoder's input, the output the greedy decoder tokens after the start token.
int run_t5(const Args& a) {
  for (const std::string& n : a.inf.notes) std::fprintf(stderr, "%s\n", n.c_str());
  const GPTConfig ck = read_checkpoint_config(a.load);
  const auto tok = checked_tokenizer(a, ck);
  const T5Tokens tt = t5_tokens(tok.get(), a.vocab_extra_ids, a.decoder_start_token_id, a.eos_token_id, ck.vocab_size);
  const int64_t start = tt.start, eos = tt.eos;
  MPT_CHECK(a.inf.device != "cuda" || cuda_available(), str("--device cuda: ", cuda_unavailable_reason()),
            "run on a machine with a GPU, or use --device cpu");
  const Device dev = a.inf.device == "cuda" || (a.inf.device == "auto" && cuda_available()) ? Device::cuda(0) : Device::cpu();
  // Under mpirun the world is the tensor-parallel group: every rank decodes every prompt (the logits are
  // gathered, so each picks the same tokens) and rank 0 writes them.
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::unique_ptr<Communicator> tp_comm;
  TensorParallel tp;
  if (world > 1) {
    CommOptions co;
    co.name = "tp";
    co.force_mpi_for_device = a.inf.force_mpi_for_device;
    tp_comm = make_communicator(MPI_COMM_WORLD, dev, co);
    tp = TensorParallel{tp_comm.get(), world, rank, false};
  }
  std::string dir;
  const std::unique_ptr<T5> model = load_t5_for_inference(a.load, dev, a.inf.dtype(), &dir, tp, MPI_COMM_WORLD);
  if (rank == 0)
    std::fprintf(stderr, "loaded %s: T5, %lld encoder + %lld decoder layers, start token %lld, eos %lld, on %s, tp %d\n",
                 dir.c_str(), static_cast<long long>(ck.encoder_num_layers), static_cast<long long>(ck.decoder_num_layers()),
                 static_cast<long long>(start), static_cast<long long>(eos), dev.is_cuda() ? "cuda" : "cpu", world);
  const GPTConfig& cfg = model->config();
  std::unique_ptr<Sink> sink = rank == 0 ? std::make_unique<Sink>(a.genfile) : nullptr;
  int64_t seen = 0;
  drive(a, tok.get(), ck.vocab_size, [&](const std::vector<Prompt>& prompts) {
    for (const Prompt& p : prompts) {
      ++seen;
      const int64_t T = static_cast<int64_t>(p.ids.size());
      MPT_CHECK(T >= 1, str("prompt ", seen, " is empty: a T5's encoder needs an input"), "give every prompt some text");
      if (cfg.learned_positions()) {
        MPT_CHECK(T <= cfg.max_position_embeddings,
                  str("prompt ", seen, " (", T, " tokens) exceeds the model's max_position_embeddings ",
                      cfg.max_position_embeddings),
                  "shorten the prompt");
        MPT_CHECK(1 + a.out_seq_length <= cfg.max_position_embeddings,
                  str("--out-seq-length ", a.out_seq_length, " + the start token exceeds the model's max_position_embeddings ",
                      cfg.max_position_embeddings),
                  str("lower --out-seq-length to at most ", cfg.max_position_embeddings - 1));
      }
      const Tensor enc = Tensor::from_ints(std::vector<int64_t>(p.ids.begin(), p.ids.end()), {1, T}, DType::I32).to(dev);
      const std::vector<int64_t> got = model->greedy(enc, T, start, eos, a.out_seq_length);
      const std::vector<int32_t> gen(got.begin() + 1, got.end());  // without the start token
      if (sink) sink->write(p.text, tok.get(), gen, !gen.empty() && gen.back() == eos);
    }
    if (sink) sink->flush();
  });
  if (sink) sink->close();
  return 0;
}

int run(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, a)) return 0;
  if (a.t5) return run_t5(a);
  ModelRunner runner(MPI_COMM_WORLD, a.load, runner_options(a.inf));
  if (runner.is_driver())
    for (const std::string& n : a.inf.notes) std::fprintf(stderr, "%s\n", n.c_str());
  const auto tok = checked_tokenizer(a, runner.config());
  const DynamicBatchingFlags& b = a.inf.batching;
  const int64_t max_requests = b.max_requests > 0 ? b.max_requests : a.micro_batch_size;
  runner.init_kv_cache(kv_cache_blocks(b, runner, max_requests), b.block_size);
  if (!runner.is_driver()) {
    runner.serve();
    return 0;
  }
  std::fprintf(stderr, "loaded %s on %s\n", runner.checkpoint_dir().c_str(), runner.describe().c_str());  // stdout may carry the samples
  MPT_CHECK(a.eos_token_id < runner.config().vocab_size,
            str("--eos-token-id ", a.eos_token_id, " is outside the vocabulary [0, ", runner.config().vocab_size, ")"), "");
  DynamicEngine engine(runner, engine_config(b, max_requests));
  Sink out(a.genfile);
  Generator g(a, engine, runner.config(), tok.get(), out);
  drive(a, tok.get(), runner.config().vocab_size, [&](const std::vector<Prompt>& p) { g.run(p); });
  out.close();
  std::fprintf(stderr, "%s\n", engine.stats().line().c_str());  // stdout may carry the samples
  runner.stop_workers();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_inference_app(argc, argv, [&] { return run(argc, argv); });
}
