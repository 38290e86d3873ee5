// evaluate — zero-shot evaluation of a checkpoint, as Megatron-LM's
// tasks/main.py --task WIKITEXT103 | LAMBADA (tasks/zeroshot_gpt/).
//   evaluate --task WIKITEXT2 --valid-data assets/text/wikitext-2.test.txt --load ckpt
//            --seq-length 1024 --overlapping-eval 32
//   evaluate --task LAMBADA --valid-data assets/text/lambada_test.jsonl --load ckpt --strict-lambada
// What is computed (docs/generate-eval.md has the details and the deviations):
//  WIKITEXT2 / WIKITEXT103 (the same computation; Megatron names only the latter):
//    raw = the whole file; num_original_tokens = len(raw.strip().split(" ")) — Megatron counts
//    the space-separated words of the RAW text, before detokenising; the text is detokenised
//    with the WikiText rules (wikitext_detokenize) and tokenised (num_tokenized_tokens ids).
//    Windows of seq_length+1 tokens start every overlapping_eval tokens (default 32 as in
//    Megatron; --overlapping-eval = seq_length means disjoint windows); window 0 scores all its targets, a later window only its last
//    overlapping_eval targets, so every target is scored exactly once with up to
//    seq_length − overlapping_eval tokens of extra context.
//    avg loss = Σ loss / (num_tokenized_tokens − 1), ppl = exp(avg loss),
//    adjusted ppl = exp(Σ loss / (num_original_tokens − 1)) (word-level perplexity; the
//    exponent is capped at 20 as in Megatron), token ratio = (ntok − 1) / (norig − 1).
//  LAMBADA (JSON lines with a "text" field): accuracy of greedy last-word prediction. An
//    example is correct when the argmax at every target position equals the target token.
//    non-strict (default): the whole text is tokenised and the target is its last token;
//    --strict-lambada: the target is the last whitespace-separated word, tokenised as
//    " " + word, after the text before it (stripped) — a multi-token word must be
//    predicted entirely.
// Tokenizers (--tokenizer-type / --tokenizer-model, data/text_tokenizer.h): the text is
// tokenised as Megatron's tokenizer.tokenize() does (HuggingFaceTokenizer / Llama2Tokenizer
// put their BOS first); the WikiText rules undo WikiText's own tokenisation and are applied
// whatever the tokenizer (as Megatron does); a strict-LAMBADA target is encoded without BOS.
// Losses and argmaxes use the first vocab_size logits (padded vocabulary rows excluded).
// Runs on one process or under mpirun with --tensor-model-parallel-size x --pipeline-model-parallel-size
// ranks; a checkpoint saved under any parallel layout loads under any. Progress every --log-interval.
//  SEQ2SEQ (T5 checkpoints only; one process): JSON lines {"input": str, "target": str}; the encoder
//    reads the input, the decoder [start] + target and is scored on target + [end] by teacher forcing,
//    as pretrain_t5's validation (model/inference/t5_eval.h): avg loss = Σ loss / Σ (|target| + 1),
//    ppl = exp(avg loss), token accuracy, exact match (every position's argmax right). Start and end
//    tokens as generate_text's (Megatron's [BOS]/[EOS] with --vocab-extra-ids, else 0 and 1). The
//    WikiText and LAMBADA tasks score a decoder LM's next-token predictions: refused for a T5 by name.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "apps/app_main.h"
#include <mpi.h>
#include <pcre2.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/device.h"
#include "core/error.h"
#include "core/files.h"
#include "core/json.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/text_tokenizer.h"
#include "data/tokenizer.h"
#include "model/flags/flag_given.h"
#include "model/flags/inference_flags.h"
#include "model/inference/runner_flags.h"
#include "model/training/pretrain_flags.h"
#include "model/inference/inference_load.h"
#include "model/inference/model_runner.h"
#include "model/inference/t5_eval.h"
#include "tensor/ops.h"

using namespace mpitron;
namespace po = boost::program_options;

namespace {

struct Args {
  std::string task, valid_data, load, vocab_file, merge_file, results_json, tokenizer_type = "GPT2BPETokenizer", tokenizer_model;
  int64_t seq_length = 0, overlapping_eval = 32, micro_batch_size = 1, log_interval = 100, vocab_extra_ids = 0;
  bool strict_lambada = false;
  InferenceFlags inf;  // the pretraining GPT_ARGS a Megatron evaluation script passes too
};

bool parse(int argc, char** argv, Args& a) {
  po::options_description d("evaluate: WikiText perplexity and LAMBADA accuracy of a checkpoint");
  d.add_options()("help,h", "print this help")
      ("task", po::value(&a.task)->required(), "WIKITEXT2, WIKITEXT103 or LAMBADA (decoder LMs); SEQ2SEQ (T5)")
      ("valid-data", po::value(&a.valid_data)->required(),
       "the evaluation file (raw WikiText .txt, LAMBADA .jsonl, or SEQ2SEQ .jsonl of {\"input\", \"target\"})")
      ("load", po::value(&a.load)->required(), "checkpoint directory (pretrain_gpt --save, or convert_checkpoint output)")
      ("seq-length", po::value(&a.seq_length), "tokens per window (default: the checkpoint's seq_length)")
      ("overlapping-eval", po::value(&a.overlapping_eval), "WikiText: window stride in tokens (default 32, as Megatron; = seq-length: no overlap)")
      ("strict-lambada", po::bool_switch(&a.strict_lambada), "LAMBADA: the target is the whole last word")
      ("micro-batch-size", po::value(&a.micro_batch_size), "WikiText: full windows per forward (default 1)")
      ("vocab-file", po::value(&a.vocab_file), "GPT-2 vocab (default: bundled assets/gpt2)")
      ("merge-file", po::value(&a.merge_file), "GPT-2 merges (default: bundled assets/gpt2)")
      ("tokenizer-type", po::value(&a.tokenizer_type)->default_value("GPT2BPETokenizer"), data::kTokenizerTypes)
      ("tokenizer-model", po::value(&a.tokenizer_model), "tokenizer.json (HuggingFaceTokenizer) or tokenizer.model")
      ("vocab-extra-ids", po::value(&a.vocab_extra_ids),
       "<extra_id_j> sentinels appended to a WordPiece vocab (pretrain_t5's; SEQ2SEQ then scores from [BOS] to [EOS])")
      ("results-json", po::value(&a.results_json), "also write the results as JSON to this file")
      ("log-interval", po::value(&a.log_interval),
       "a progress line every N windows (WikiText) or examples (LAMBADA): done of total, running loss, tokens/s "
       "(default 100)");
  add_inference_flags(d, a.inf, /*with_seq_length=*/false, pretrain_flag_descriptions());  // --seq-length is the window here
  po::variables_map vm;
  if (!parse_app_flags(argc, argv, d, vm, "evaluate", /*megatron=*/true)) return false;
  check_inference_flags(vm, a.inf);
  const bool t5 = checkpoint_exists(a.load) && read_checkpoint_config(a.load).t5;
  if (checkpoint_exists(a.load)) check_against_checkpoint(vm, a.inf, read_checkpoint_config(a.load), a.load, /*allow_t5=*/t5);
  MPT_CHECK(!t5 || a.task == "SEQ2SEQ",
            str("--task ", a.task, " with the T5 checkpoint ", a.load,
                ": WikiText and LAMBADA score a decoder language model's next-token predictions over running text; "
                "a T5 reads an input and writes an answer"),
            "evaluate a T5 with --task SEQ2SEQ (JSON lines {\"input\", \"target\"}: the targets' teacher-forced loss, "
            "perplexity and accuracy, as pretrain_t5's validation)");
  MPT_CHECK(t5 || a.task != "SEQ2SEQ" || !checkpoint_exists(a.load),
            str("--task SEQ2SEQ needs an encoder-decoder (T5) checkpoint; ", a.load, " holds a decoder language model"),
            "use --task WIKITEXT103 or LAMBADA");
  if (t5) {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPT_CHECK(world == 1 && a.inf.tp == 1 && a.inf.pp == 1,
              str("evaluate with the T5 checkpoint ", a.load, " runs on one process; it was started on ", world,
                  " ranks (--tensor-model-parallel-size ", a.inf.tp, ", --pipeline-model-parallel-size ", a.inf.pp, ")"),
              "run it without mpirun and without the parallel sizes");
  }
  MPT_CHECK(a.vocab_extra_ids >= 0, str("--vocab-extra-ids must be >= 0, got ", a.vocab_extra_ids), "");
  const DynamicBatchingFlags none;
  const DynamicBatchingFlags& b = a.inf.batching;
  if (b.enabled || b.chunked_prefill || b.buffer_size_gb != none.buffer_size_gb || b.block_size != none.block_size ||
      b.max_requests != none.max_requests || b.max_tokens != none.max_tokens)
    a.inf.notes.push_back("--inference-dynamic-batching*, --enable-chunked-prefill: evaluate scores whole windows "
                          "(no KV cache, no engine)");
  for (const std::string& n : a.inf.notes) log_info(n);
  MPT_CHECK(a.log_interval >= 1, str("--log-interval must be >= 1, got ", a.log_interval), "");
  MPT_CHECK(a.task == "WIKITEXT2" || a.task == "WIKITEXT103" || a.task == "LAMBADA" || a.task == "SEQ2SEQ",
            str("--task ", a.task, " is not supported"), "use WIKITEXT2, WIKITEXT103, LAMBADA or (T5) SEQ2SEQ");
  // Flags that mean something for one task only; given for another task they would do nothing, silently.
  // (--overlapping-eval and --micro-batch-size stay accepted for LAMBADA: Megatron's scripts pass them.)
  static const std::pair<const char*, const char*> kTaskOnly[] = {{"strict-lambada", "LAMBADA"}};
  for (const auto& [flag, task] : kTaskOnly)
    MPT_CHECK(!flag_given(vm, flag) || a.task == task, str("--", flag, " applies to --task ", task, ", not ", a.task),
              str("drop --", flag));
  MPT_CHECK(a.micro_batch_size >= 1, str("--micro-batch-size must be >= 1, got ", a.micro_batch_size), "");
  // 0 never means "not set": leave the flag out for the checkpoint's length.
  MPT_CHECK(!vm.count("seq-length") || a.seq_length >= 1, str("--seq-length must be >= 1, got ", a.seq_length),
            "leave it out to use the checkpoint's seq_length");
  MPT_CHECK(a.overlapping_eval >= 1, str("--overlapping-eval must be >= 1, got ", a.overlapping_eval), "");
  return true;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MPT_CHECK(f.good(), str("cannot open ", path), "check --valid-data");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
}

// Python re.sub(pattern, repl, s) with PCRE2 (UTF + UCP); repl uses $1 for a group.
void regex_sub(std::string& s, const char* pattern, const char* repl) {
  int err = 0;
  PCRE2_SIZE erroff = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                 &err, &erroff, nullptr);
  MPT_CHECK(re != nullptr, str("detokenizer: bad pattern ", pattern), "");
  std::string out(s.size() + 64, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    PCRE2_SIZE n = out.size();
    const int rc = pcre2_substitute(re, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0,
                                    PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_OVERFLOW_LENGTH, nullptr, nullptr,
                                    reinterpret_cast<PCRE2_SPTR>(repl), PCRE2_ZERO_TERMINATED,
                                    reinterpret_cast<PCRE2_UCHAR*>(out.data()), &n);
    if (rc == PCRE2_ERROR_NOMEMORY) {
      out.resize(n + 1);
      continue;
    }
    pcre2_code_free(re);
    MPT_CHECK(rc >= 0, str("detokenizer: substitution with ", pattern, " failed (", rc, ")"), "");
    out.resize(n);
    s = out;
    return;
  }
  pcre2_code_free(re);
  MPT_THROW("detokenizer: substitution buffer", "");
}

// The WikiText detokeniser of Megatron's tasks/zeroshot_gpt/detokenizer.py, rule by rule.
std::string wikitext_detokenize(std::string s) {
  replace_all(s, "s '", "s'");                       // contractions
  regex_sub(s, "/' [0-9]/", "/'[0-9]/");            // (a literal pattern in Megatron, kept as is)
  replace_all(s, " @-@ ", "-");                      // number separators
  replace_all(s, " @,@ ", ",");
  replace_all(s, " @.@ ", ".");
  for (const char* p : {":", ";", ".", "!", "?", ","}) replace_all(s, str(" ", p, " "), str(p, " "));  // punctuation
  regex_sub(s, "\\(\\s*([^\\)]*?)\\s*\\)", "($1)");  // brackets and quotes: no inner padding
  regex_sub(s, "\\[\\s*([^\\]]*?)\\s*\\]", "[$1]");
  regex_sub(s, "{\\s*([^}]*?)\\s*}", "{$1}");
  regex_sub(s, "\"\\s*([^\"]*?)\\s*\"", "\"$1\"");
  regex_sub(s, "'\\s*([^']*?)\\s*'", "'$1'");
  replace_all(s, "= = = =", "====");                 // headings
  replace_all(s, "= = =", "===");
  replace_all(s, "= =", "==");
  replace_all(s, " \xC2\xB0 ", "\xC2\xB0");          // degree sign
  replace_all(s, " \n", "\n");
  replace_all(s, "\n ", "\n");
  replace_all(s, " N ", " 1 ");
  replace_all(s, " 's", "'s");
  return s;
}

// Python's str.isspace() for the code point starting at s[i]; sets len to its UTF-8 length.
bool py_space(const std::string& s, size_t i, size_t& len) {
  const auto u = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = u(i);
  len = 1;
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
  uint32_t cp = 0;
  if ((c & 0xe0) == 0xc0 && i + 1 < s.size()) cp = ((c & 0x1fu) << 6) | (u(i + 1) & 0x3fu), len = 2;
  else if ((c & 0xf0) == 0xe0 && i + 2 < s.size()) cp = ((c & 0x0fu) << 12) | ((u(i + 1) & 0x3fu) << 6) | (u(i + 2) & 0x3fu), len = 3;
  else if ((c & 0xf8) == 0xf0) len = 4;
  return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// Python's s.strip() and s.split() (whitespace as str.isspace()).
std::string py_strip(const std::string& s) {
  size_t b = 0, len = 0;
  while (b < s.size() && py_space(s, b, len)) b += len;
  size_t e = b, i = b;
  while (i < s.size()) {
    const bool sp = py_space(s, i, len);
    i += len;
    if (!sp) e = i;
  }
  return s.substr(b, e - b);
}
std::string py_last_word(const std::string& s) {
  std::string last, cur;
  size_t i = 0, len = 0;
  while (i < s.size()) {
    if (py_space(s, i, len)) {
      if (!cur.empty()) last = cur;
      cur.clear();
    } else {
      cur.append(s, i, len);
    }
    i += len;
  }
  return cur.empty() ? last : cur;
}

// A progress line every --log-interval units: done of total, running loss, tokens/s.
class Progress {
 public:
  Progress(const char* what, int64_t total, int64_t interval) : what_(what), total_(total), interval_(interval) {}
  void add(int64_t units, double loss, int64_t scored, int64_t tokens) {
    const int64_t before = done_ / interval_;
    done_ += units, loss_ += loss, scored_ += scored, tokens_ += tokens;
    if (done_ / interval_ == before && done_ < total_) return;
    const double s = timer_.seconds();
    char line[256];
    std::snprintf(line, sizeof line, "%s %lld/%lld | running avg loss %.4f | %.0f tokens/s | %.1f s", what_,
                  static_cast<long long>(done_), static_cast<long long>(total_),
                  scored_ > 0 ? loss_ / static_cast<double>(scored_) : 0.0, static_cast<double>(tokens_) / std::max(s, 1e-9),
                  s);
    log_info(line);
  }

 private:
  const char* what_;
  int64_t total_, interval_, done_ = 0, scored_ = 0, tokens_ = 0;
  double loss_ = 0;
  Timer timer_;
};

// Every rank runs it (the windows are scored collectively); the numbers are the driver's.
nlohmann::json eval_wikitext(ModelRunner& runner, const data::TextTokenizer& tok, const Args& a, int64_t seq,
                             int64_t overlap) {
  const std::string raw = read_file(a.valid_data);
  // Megatron: len(entire_data.strip().split(" ")) on the raw text.
  const std::string stripped = py_strip(raw);
  int64_t num_original = 1;
  for (char c : stripped) num_original += c == ' ';
  auto enc = tok.make_encoder();
  const std::vector<int32_t> ids = enc->encode(wikitext_detokenize(raw));
  const int64_t ntok = static_cast<int64_t>(ids.size());
  MPT_CHECK(ntok >= 2, str(a.valid_data, " holds ", ntok, " tokens: nothing to evaluate"), "");
  MPT_CHECK(num_original >= 2, str(a.valid_data, " holds fewer than 2 words"), "");
  const int64_t targets = ntok - 1;
  const int64_t nwin = std::max<int64_t>((std::max<int64_t>(targets - overlap, 0) + overlap - 1) / overlap + 1, 1);
  double total = 0;
  int64_t scored = 0;
  Timer timer;
  Progress progress("windows", nwin, a.log_interval);
  for (int64_t w0 = 0; w0 < nwin;) {
    // Batch consecutive windows of the same length.
    const auto win_len = [&](int64_t w) { return std::min(seq, targets - w * overlap); };  // targets in window w
    const int64_t T = win_len(w0);
    int64_t B = 0;
    while (w0 + B < nwin && B < a.micro_batch_size && win_len(w0 + B) == T && T > 0) ++B;
    if (T <= 0) {  // only padding (cannot happen with the window count above; kept for safety)
      ++w0;
      continue;
    }
    std::vector<int32_t> in, tgt;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t s = (w0 + b) * overlap;
      for (int64_t t = 0; t < T; ++t) {
        in.push_back(ids[static_cast<size_t>(s + t)]);
        tgt.push_back(ids[static_cast<size_t>(s + t + 1)]);
      }
    }
    const ScoreOutput out = runner.score(in, tgt, B, T);
    double batch_loss = 0;
    int64_t batch_scored = 0;
    if (runner.is_driver())
      for (int64_t b = 0; b < B; ++b) {
        const int64_t w = w0 + b;
        // Megatron: pad_mask[:-overlap] = 0 for every window but the first (when overlapping).
        const int64_t first = (overlap != seq && w != 0) ? seq - overlap : 0;
        for (int64_t t = first; t < T; ++t) batch_loss += out.loss[static_cast<size_t>(b * T + t)];
        batch_scored += std::max<int64_t>(T - first, 0);
      }
    total += batch_loss;
    scored += batch_scored;
    progress.add(B, batch_loss, batch_scored, B * T);
    w0 += B;
  }
  const double avg = total / static_cast<double>(ntok - 1);
  const double ratio = static_cast<double>(ntok - 1) / static_cast<double>(num_original - 1);
  nlohmann::json r = {{"task", a.task},
                      {"seq_length", seq},
                      {"overlapping_eval", overlap},
                      {"num_original_tokens", num_original},
                      {"num_tokenized_tokens", ntok},
                      {"windows", nwin},
                      {"scored_targets", scored},
                      {"total_loss", total},
                      {"avg_loss", avg},
                      {"ppl", std::exp(std::min(20.0, avg))},
                      {"adjusted_ppl", std::exp(std::min(20.0, avg * ratio))},
                      {"token_ratio", ratio},
                      {"seconds", timer.seconds()}};
  char line[512];
  std::snprintf(line, sizeof line,
                "validation results on %s | avg loss: %.4E | ppl: %.4E | adjusted ppl: %.4E | token ratio: %.6f |",
                a.task.c_str(), avg, r["ppl"].get<double>(), r["adjusted_ppl"].get<double>(), ratio);
  log_info(line);
  return r;
}

nlohmann::json eval_lambada(ModelRunner& runner, const data::TextTokenizer& tok, const Args& a, int64_t seq) {
  LineReader f(a.valid_data, "--valid-data");
  auto enc = tok.make_encoder();
  auto plain = tok.make_encoder(false);  // the target word: no BOS before it (HF / Llama2Tokenizer)
  nlohmann::json examples = nlohmann::json::array();
  int64_t correct = 0, n = 0, lineno = 0, truncated = 0;
  Timer timer;
  std::vector<std::string> lines;
  for (std::string line; f.next(line);) lines.push_back(line);
  int64_t total_examples = 0;
  for (const std::string& l : lines) total_examples += !l.empty();
  Progress progress("examples", total_examples, a.log_interval);
  for (const std::string& line : lines) {
    ++lineno;
    if (line.empty()) continue;
    std::string text;
    try {
      text = parse_json_text(line, "the line").at("text").get<std::string>();
    } catch (const std::exception& e) {
      MPT_THROW(str(a.valid_data, ":", lineno, ": not a JSON object with a \"text\" string: ", e.what()), "");
    }
    std::vector<int32_t> ctx, target;
    // Both modes score the passage's last word: a passage without one (empty, whitespace only) is an error.
    const std::string last = py_last_word(text);
    MPT_CHECK(!last.empty(), str(a.valid_data, ":", lineno, ": the passage has no word to predict (",
                                 text.empty() ? "empty" : "whitespace only", ")"),
              "every LAMBADA line is {\"text\": \"<passage> <last word>\"}");
    if (a.strict_lambada) {
      ctx = enc->encode(py_strip(text.substr(0, text.rfind(last))));
      target = plain->encode(" " + last);
    } else {
      ctx = enc->encode(text);
      MPT_CHECK(ctx.size() >= 2, str(a.valid_data, ":", lineno, ": fewer than 2 tokens"), "");
      target = {ctx.back()};
      ctx.pop_back();
    }
    MPT_CHECK(!ctx.empty(), str(a.valid_data, ":", lineno, ": no context before the last word"), "");
    MPT_CHECK(static_cast<int64_t>(target.size()) <= seq,
              str(a.valid_data, ":", lineno, ": the last word alone is ", target.size(), " tokens, more than --seq-length"),
              "raise --seq-length");
    // A context longer than the model's window keeps its last tokens (the ones
    // next to the word to predict), as a left-truncated prompt; counted below.
    const int64_t room = seq - static_cast<int64_t>(target.size()) + 1;
    if (static_cast<int64_t>(ctx.size()) > room) {
      ctx.erase(ctx.begin(), ctx.end() - room);
      ++truncated;
    }
    std::vector<int32_t> seqv(ctx.begin(), ctx.end());
    seqv.insert(seqv.end(), target.begin(), target.end() - 1);
    const int64_t T = static_cast<int64_t>(seqv.size());
    MPT_CHECK(T <= seq, str(a.valid_data, ":", lineno, ": ", T + 1, " tokens exceed --seq-length ", seq, " + 1"),
              "raise --seq-length (up to the model's max_position_embeddings)");
    // Targets: the next token at every position (the context's own continuation, then the word).
    std::vector<int32_t> tgt(seqv.begin() + 1, seqv.end());
    tgt.push_back(target.back());
    const ScoreOutput out = runner.score(seqv, tgt, 1, T);
    ++n;
    if (!runner.is_driver()) continue;
    std::vector<int32_t> pred;
    double loss = 0;
    for (size_t j = 0; j < target.size(); ++j) {
      const size_t at = ctx.size() - 1 + j;
      pred.push_back(out.argmax[at]);
      loss += out.loss[at];
    }
    const bool ok = pred == target;
    correct += ok;
    examples.push_back({{"context_len", ctx.size()}, {"target", target}, {"pred", pred}, {"correct", ok}});
    progress.add(1, loss, static_cast<int64_t>(target.size()), T);
  }
  MPT_CHECK(n > 0, str(a.valid_data, " holds no examples"), "");
  if (truncated > 0 && runner.is_driver())
    log_warn(truncated, " of ", n, " LAMBADA contexts were longer than --seq-length ", seq,
             " and were cut to their last tokens");
  const double acc = static_cast<double>(correct) / static_cast<double>(n);
  log_info("validation results on LAMBADA", a.strict_lambada ? " (strict)" : "", " | number correct: ", correct,
           ", total: ", n, ", accuracy: ", acc * 100.0, " %");
  return {{"task", a.task}, {"strict", a.strict_lambada}, {"accuracy", acc}, {"correct", correct},
          {"total", n},     {"examples", examples},       {"seconds", timer.seconds()}};
}

// SEQ2SEQ on a T5 (one process): the targets' teacher-forced loss (see the top of the file).
nlohmann::json eval_seq2seq(const data::TextTokenizer& tok, const Args& a) {
  const std::unique_ptr<T5> model =
      load_t5_for_inference(a.load, a.inf.device == "cuda" || (a.inf.device == "auto" && cuda_available()) ? Device::cuda(0)
                                                                                                           : Device::cpu(),
                            a.inf.dtype());
  const GPTConfig& c = model->config();
  MPT_CHECK(c.vocab_size == tok.vocab_size(),
            str("the checkpoint's vocab_size ", c.vocab_size, " differs from the tokenizer's ", tok.vocab_size()),
            "pass the tokenizer flags the model was trained with (--tokenizer-type, --vocab-file, --vocab-extra-ids)");
  const T5Tokens tt = t5_tokens(&tok, a.vocab_extra_ids, -1, -1, c.vocab_size);
  log_info("loaded T5 ", a.load, " (", c.encoder_num_layers, " encoder + ", c.decoder_num_layers(),
           " decoder layers, hidden ", c.hidden_size, "), start token ", tt.start, ", end token ", tt.eos);
  LineReader f(a.valid_data, "--valid-data");
  auto enc = tok.make_encoder(), plain = tok.make_encoder(false);  // the target: no BOS (the decoder has its start)
  std::vector<std::string> lines;
  for (std::string line; f.next(line);) lines.push_back(line);
  int64_t total = 0;
  for (const std::string& l : lines) total += !l.empty();
  Progress progress("examples", total, a.log_interval);
  Timer timer;
  double loss = 0;
  int64_t tokens = 0, correct = 0, exact = 0, n = 0, lineno = 0;
  for (const std::string& line : lines) {
    ++lineno;
    if (line.empty()) continue;
    std::string input, target;
    try {
      const nlohmann::json j = parse_json_text(line, "the line");
      input = j.at("input").get<std::string>();
      target = j.at("target").get<std::string>();
    } catch (const std::exception& e) {
      MPT_THROW(str(a.valid_data, ":", lineno, ": not a JSON object with \"input\" and \"target\" strings: ", e.what()),
                "every SEQ2SEQ line is {\"input\": \"...\", \"target\": \"...\"}");
    }
    const std::vector<int32_t> x = enc->encode(input), y = plain->encode(target);
    MPT_CHECK(!x.empty(), str(a.valid_data, ":", lineno, ": the input has no tokens (a T5's encoder needs one)"), "");
    const Seq2SeqScore s = score_seq2seq(*model, x, y, tt);
    loss += s.loss, tokens += s.tokens, correct += s.correct, exact += s.exact, ++n;
    progress.add(1, s.loss, s.tokens, static_cast<int64_t>(x.size()) + s.tokens);
  }
  MPT_CHECK(n > 0, str(a.valid_data, " holds no examples"), "");
  const double avg = loss / static_cast<double>(tokens), acc = static_cast<double>(correct) / static_cast<double>(tokens);
  const double em = static_cast<double>(exact) / static_cast<double>(n);
  log_info("validation results on SEQ2SEQ | avg loss: ", avg, " | ppl: ", std::exp(avg), " | token accuracy: ",
           acc * 100.0, " % | exact match: ", exact, " of ", n, " | target tokens: ", tokens);
  return {{"task", a.task}, {"avg_loss", avg}, {"ppl", std::exp(avg)}, {"tokens", tokens}, {"token_accuracy", acc},
          {"exact_match", em}, {"exact", exact}, {"total", n}, {"checkpoint", a.load}, {"seconds", timer.seconds()}};
}

int run(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, a)) return 0;
  data::TokenizerSpec spec{a.tokenizer_type, a.tokenizer_model, a.vocab_file, a.merge_file};
  spec.vocab_extra_ids = a.vocab_extra_ids;
  const auto tok_ptr = data::make_tokenizer(spec);
  const data::TextTokenizer& tok = *tok_ptr;
  if (a.task == "SEQ2SEQ") {  // a T5 (parse refused it for any other checkpoint)
    const nlohmann::json r = eval_seq2seq(tok, a);
    if (!a.results_json.empty()) write_file_checked(a.results_json, r.dump() + "\n", "--results-json");
    return 0;
  }
  ModelRunner runner(MPI_COMM_WORLD, a.load, runner_options(a.inf));
  const GPTConfig& c = runner.config();
  MPT_CHECK(c.vocab_size == tok.vocab_size(),
            str("the checkpoint's vocab_size ", c.vocab_size, " differs from the tokenizer's ", tok.vocab_size()),
            "pass the tokenizer flags the model was trained with (--tokenizer-type, --tokenizer-model or --vocab-file/--merge-file)");
  log_info("loaded ", runner.checkpoint_dir(), " (", c.num_layers, " layers, hidden ", c.hidden_size, ") on ",
           runner.describe());
  const int64_t seq = a.seq_length > 0 ? a.seq_length : c.seq_length;
  MPT_CHECK(seq <= c.max_position_embeddings,
            str("--seq-length ", seq, " exceeds the model's max_position_embeddings ", c.max_position_embeddings), "");
  nlohmann::json r;
  if (a.task == "LAMBADA") {
    r = eval_lambada(runner, tok, a, seq);
  } else {
    const int64_t overlap = std::min(a.overlapping_eval, seq);
    MPT_CHECK(overlap >= 1, str("--overlapping-eval must be >= 1, got ", a.overlapping_eval), "");
    r = eval_wikitext(runner, tok, a, seq, overlap);
  }
  if (!runner.is_driver()) return 0;
  r["checkpoint"] = runner.checkpoint_dir();
  r["layout"] = runner.describe();
  if (!a.results_json.empty()) {
    write_file_checked(a.results_json, r.dump() + "\n", "--results-json");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_inference_app(argc, argv, [&] { return run(argc, argv); });
}
