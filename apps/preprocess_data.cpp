// apps/preprocess_data.cpp — JSON lines → Megatron .bin/.idx, the flags of
// Megatron-LM's tools/preprocess_data.py:
//   preprocess_data --input corpus.jsonl --output-prefix out/corpus
//       --json-keys text --append-eod --workers 4
//       --tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt
//   or  --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer.json (text encoded as
//       AutoTokenizer(text).input_ids, i.e. with its BOS; --append-eod appends eos_token), or
//       --tokenizer-type SentencePieceTokenizer | Llama2Tokenizer --tokenizer-model tokenizer.model
// writes out/corpus_text_document.{bin,idx} (one per --json-keys key).
// --split-sentences (data/sentence_splitter.h) writes out/corpus_text_sentence.{bin,idx}
// instead: one sequence per sentence, the document index marking the documents (as
// Megatron's does for BERT); --append-eod then ends each document's last sentence.
//
// The input is read in chunks of whole lines (memory stays bounded whatever
// the input size); each chunk is split into one contiguous slice per worker,
// tokenised in parallel, and written in input order, so the output bytes do not
// depend on --workers. Lines that are bad JSON, lack a key, hold a non-string,
// or are not UTF-8 stop the run (--on-error fail, the default, like Megatron)
// or are skipped and counted (--on-error skip); either way the line number is
// reported. Blank lines are skipped (Megatron would crash on them).
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/files.h"
#include "core/json.h"
#include "core/timer.h"
#include "data/indexed_dataset.h"
#include "data/sentence_splitter.h"
#include "data/text_tokenizer.h"
#include "data/tokenizer.h"

namespace po = boost::program_options;
using namespace mpitron;
using namespace mpitron::data;

namespace {

struct Options {
  std::string input, output_prefix, tokenizer_type = "GPT2BPETokenizer", tokenizer_model, vocab_file, merge_file, on_error = "fail";
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false, split_sentences = false, keep_newlines = false;
  int workers = 1;
  int64_t log_interval = 100000;
  double chunk_mb = 16;  // MB of input per step
};

// One worker's results for a slice of lines.
struct SliceResult {
  struct Key {
    std::vector<int32_t> tokens;    // all documents back to back
    std::vector<int32_t> seq_lens;  // sequences of all documents
    std::vector<int32_t> doc_nseq;  // sequences per document
  };
  std::vector<Key> keys;
  std::vector<std::pair<int64_t, std::string>> errors;  // (line number, what)
  int64_t docs = 0, blank = 0;
};

bool is_blank(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') return false;
  return true;
}

void process_slice(const std::vector<std::string_view>& lines, size_t begin, size_t end, int64_t first_line_no,
                   const Options& opt, const TextTokenizer& tok, TextEncoder& enc, SliceResult& out) {
  out = SliceResult();
  out.keys.resize(opt.json_keys.size());
  std::vector<size_t> mark(opt.json_keys.size());
  for (size_t i = begin; i < end; ++i) {
    const int64_t line_no = first_line_no + static_cast<int64_t>(i);
    std::string_view line = lines[i];
    if (is_blank(line)) {
      ++out.blank;
      continue;
    }
    int64_t bad = find_invalid_utf8(line);
    if (bad >= 0) {
      out.errors.emplace_back(line_no, str("invalid UTF-8 at byte ", bad));
      continue;
    }
    nlohmann::json j;
    try {
      j = parse_json_text(line, "the line");
    } catch (const Error& e) {
      out.errors.emplace_back(line_no, str("bad JSON: ", e.message()));
      continue;
    }
    if (!j.is_object()) {
      out.errors.emplace_back(line_no, "not a JSON object");
      continue;
    }
    // Remember where each key's output stood, to roll back a half-done line.
    for (size_t k = 0; k < mark.size(); ++k) mark[k] = out.keys[k].doc_nseq.size();
    std::string error;
    for (size_t k = 0; k < opt.json_keys.size() && error.empty(); ++k) {
      auto it = j.find(opt.json_keys[k]);
      if (it == j.end()) {
        error = str("missing key '", opt.json_keys[k], "'");
        break;
      }
      SliceResult::Key& key = out.keys[k];
      int32_t nseq = 0;
      auto add = [&](std::string_view text) {
        size_t before = key.tokens.size();
        enc.encode(text, key.tokens);
        int64_t n = static_cast<int64_t>(key.tokens.size() - before);
        if (n > 0) {  // Megatron keeps only non-empty sentences
          key.seq_lens.push_back(static_cast<int32_t>(n));
          ++nseq;
        }
      };
      if (it->is_string() && opt.split_sentences) {
        for (std::string_view s : split_sentences(it->get_ref<const std::string&>(), opt.keep_newlines))
          add(s);
      } else if (it->is_string()) {
        add(it->get_ref<const std::string&>());
      } else if (it->is_array() && std::all_of(it->begin(), it->end(), [](const auto& x) { return x.is_string(); })) {
        for (const auto& s : *it) add(s.get_ref<const std::string&>());  // pre-split sentences
      } else {
        error = str("key '", opt.json_keys[k], "' is not a string (", it->type_name(), ")");
        break;
      }
      if (nseq > 0 && opt.append_eod) {
        key.tokens.push_back(tok.eod());
        key.seq_lens.back() += 1;
      }
      key.doc_nseq.push_back(nseq);
    }
    if (!error.empty()) {
      out.errors.emplace_back(line_no, error);
      for (size_t k = 0; k < mark.size(); ++k) {  // drop this line's partial documents
        SliceResult::Key& key = out.keys[k];
        while (key.doc_nseq.size() > mark[k]) {
          int32_t nseq = key.doc_nseq.back();
          key.doc_nseq.pop_back();
          for (int32_t s = 0; s < nseq; ++s) {
            key.tokens.resize(key.tokens.size() - key.seq_lens.back());
            key.seq_lens.pop_back();
          }
        }
      }
      continue;
    }
    ++out.docs;
  }
}

int run(const Options& opt) {
  MPT_CHECK(opt.workers >= 1 && opt.workers <= 256, str("--workers ", opt.workers, " must be in [1, 256]"), "");
  MPT_CHECK(opt.on_error == "fail" || opt.on_error == "skip",
            str("--on-error '", opt.on_error, "' must be 'fail' or 'skip'"), "");
  MPT_CHECK(!opt.json_keys.empty(), "--json-keys is empty", "");
  MPT_CHECK(std::isfinite(opt.chunk_mb) && opt.chunk_mb > 0 && opt.chunk_mb <= 65536,
            str("--chunk-mb must be a number in (0, 65536], got ", opt.chunk_mb),
            "the default 16 reads 16 MB of input per step; fractions such as 0.5 are allowed");
  MPT_CHECK(opt.log_interval >= 0, str("--log-interval must be >= 0 (0: no progress lines), got ", opt.log_interval),
            "");
  {
    std::error_code ec;
    MPT_CHECK(!std::filesystem::is_directory(opt.input, ec),
              str("--input '", opt.input, "' is a directory"),
              "give one JSON-lines file (run once per file, then merge_datasets to join the outputs)");
  }
  const auto tok_ptr = make_tokenizer({opt.tokenizer_type, opt.tokenizer_model, opt.vocab_file, opt.merge_file});
  const TextTokenizer& tok = *tok_ptr;
  if (opt.append_eod) tok.eod();  // a tokenizer without one fails here, naming its file
  std::vector<std::unique_ptr<TextEncoder>> encoders;
  for (int w = 0; w < opt.workers; ++w) encoders.push_back(tok.make_encoder());

  std::ifstream in(opt.input, std::ios::binary);
  MPT_CHECK(in.good(), str("cannot open --input '", opt.input, "'"), "check the path");
  const DType dtype = token_dtype_for_vocab(tok.vocab_size());
  const std::string level = opt.split_sentences ? "_sentence" : "_document";  // Megatron's file names
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const auto& key : opt.json_keys)
    writers.push_back(std::make_unique<IndexedDatasetWriter>(opt.output_prefix + "_" + key + level, dtype));

  const size_t chunk_bytes = std::max<size_t>(64, static_cast<size_t>(opt.chunk_mb * (1 << 20)));
  std::string buf, carry;
  std::vector<std::string_view> lines;
  std::vector<SliceResult> results(opt.workers);
  int64_t line_no = 1, docs = 0, tokens = 0, bytes = 0, blank = 0, next_log = opt.log_interval;
  std::vector<std::pair<int64_t, std::string>> skipped;
  Timer timer;
  bool eof = false;
  while (!eof) {
    // Read the next chunk and cut it after its last newline. A line longer than
    // the chunk grows the read geometrically and only the new bytes are searched
    // for a newline, so one 50 MB line costs linear time whatever --chunk-mb.
    buf.swap(carry);
    carry.clear();
    size_t searched = buf.size();  // the carried bytes hold no newline
    size_t want = std::max(chunk_bytes, buf.size());
    size_t nl = std::string::npos;
    while (true) {
      const size_t old = buf.size();
      buf.resize(old + want);
      in.read(&buf[old], static_cast<std::streamsize>(want));
      buf.resize(old + static_cast<size_t>(in.gcount()));
      eof = !in;
      MPT_CHECK(!in.bad(), str("--input '", opt.input, "': read error after ", bytes + buf.size(), " bytes"), "");
      if (eof) break;
      const void* p = memrchr(buf.data() + searched, '\n', buf.size() - searched);
      if (p) {
        nl = static_cast<size_t>(static_cast<const char*>(p) - buf.data());
        break;
      }
      searched = buf.size();
      // No newline in all of buf: it is one line, and a line past the bound (a
      // file without newlines, /dev/zero) is an error, not unbounded memory.
      MPT_CHECK(static_cast<int64_t>(buf.size()) <= kMaxLineBytes,
                str("--input '", opt.input, "' line ", line_no, " is longer than ", kMaxLineBytes >> 20,
                    " MiB (no newline)"),
                "preprocess_data reads JSON lines (one document per line); split the document or fix the file");
      want = buf.size();  // double
    }
    if (!eof) {
      carry.assign(buf, nl + 1, std::string::npos);
      buf.resize(nl + 1);
    }
    lines.clear();
    for (size_t pos = 0; pos < buf.size();) {
      size_t nl = buf.find('\n', pos);
      if (nl == std::string::npos) nl = buf.size();
      lines.emplace_back(buf.data() + pos, nl - pos);
      pos = nl + 1;
    }
    bytes += static_cast<int64_t>(buf.size());
    // Contiguous slices of about equal bytes, one per worker.
    std::vector<size_t> cut{0};
    for (int w = 1; w < opt.workers; ++w) {
      const size_t target = buf.size() * w / opt.workers;
      size_t i = cut.back();
      while (i < lines.size() && static_cast<size_t>(lines[i].data() - buf.data()) < target) ++i;
      cut.push_back(i);
    }
    cut.push_back(lines.size());
    std::vector<std::exception_ptr> fail(opt.workers);
    auto work = [&](int w) {
      try {
        process_slice(lines, cut[w], cut[w + 1], line_no, opt, tok, *encoders[w], results[w]);
      } catch (...) {
        fail[w] = std::current_exception();
      }
    };
    if (opt.workers == 1) {
      work(0);
    } else {
      std::vector<std::thread> threads;
      for (int w = 0; w < opt.workers; ++w) threads.emplace_back(work, w);
      for (auto& t : threads) t.join();
    }
    for (auto& f : fail)
      if (f) std::rethrow_exception(f);
    // Write in input order.
    for (int w = 0; w < opt.workers; ++w) {
      SliceResult& r = results[w];
      if (!r.errors.empty() && opt.on_error == "fail") {
        MPT_THROW(str(opt.input, ":", r.errors.front().first, ": ", r.errors.front().second),
                  "fix the line, or pass --on-error skip to skip and count bad lines");
      }
      skipped.insert(skipped.end(), r.errors.begin(), r.errors.end());
      for (size_t k = 0; k < writers.size(); ++k) {
        const SliceResult::Key& key = r.keys[k];
        size_t seq = 0, off = 0;
        for (int32_t nseq : key.doc_nseq) {
          for (int32_t s = 0; s < nseq; ++s, ++seq) {
            writers[k]->add_tokens(key.tokens.data() + off, key.seq_lens[seq]);
            off += key.seq_lens[seq];
          }
          writers[k]->end_document();
        }
        tokens += static_cast<int64_t>(key.tokens.size());
      }
      docs += r.docs;
      blank += r.blank;
    }
    line_no += static_cast<int64_t>(lines.size());
    if (opt.log_interval > 0 && docs >= next_log) {
      const double s = std::max(timer.seconds(), 1e-9);
      std::fprintf(stderr, "processed %lld documents (%.0f docs/s, %.2f MB/s)\n", static_cast<long long>(docs),
                   docs / s, bytes / s / 1e6);
      while (next_log <= docs) next_log += opt.log_interval;
    }
  }
  for (auto& w : writers) w->finalize();
  const double s = std::max(timer.seconds(), 1e-9);
  std::fprintf(stderr, "done: %lld documents, %lld tokens, %.1f MB in %.2f s (%.0f docs/s, %.2f MB/s), workers=%d\n",
               static_cast<long long>(docs), static_cast<long long>(tokens), bytes / 1e6, s, docs / s,
               bytes / s / 1e6, opt.workers);
  if (blank) std::fprintf(stderr, "skipped %lld blank lines\n", static_cast<long long>(blank));
  if (!skipped.empty()) {
    std::fprintf(stderr, "skipped %zu bad lines (--on-error skip):\n", skipped.size());
    for (size_t i = 0; i < skipped.size() && i < 20; ++i)
      std::fprintf(stderr, "  %s:%lld: %s\n", opt.input.c_str(), static_cast<long long>(skipped[i].first),
                   skipped[i].second.c_str());
    if (skipped.size() > 20) std::fprintf(stderr, "  ...\n");
  }
  for (const auto& key : opt.json_keys)
    std::fprintf(stderr, "wrote %s_%s%s.{bin,idx} (%s)\n", opt.output_prefix.c_str(), key.c_str(), level.c_str(),
                 dtype_name(dtype));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  po::options_description desc("preprocess_data: JSON lines → Megatron .bin/.idx");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("input", po::value(&opt.input)->required(), "input file, one JSON object per line")
    ("output-prefix", po::value(&opt.output_prefix)->required(),
     "writes <prefix>_<key>_document.{bin,idx} (with --split-sentences: <prefix>_<key>_sentence.{bin,idx})")
    ("json-keys", po::value(&opt.json_keys)->multitoken(), "keys to extract (default: text)")
    ("append-eod", po::bool_switch(&opt.append_eod), "append the tokenizer's eod (GPT-2: <|endoftext|>; HF: eos_token; BERT: [EOS]) to every non-empty document (to its last sentence)")
    ("split-sentences", po::bool_switch(&opt.split_sentences),
     "one sequence per sentence (rule-based splitter, docs/data.md), files <prefix>_<key>_sentence; for BERT")
    ("keep-newlines", po::bool_switch(&opt.keep_newlines),
     "with --split-sentences: keep the whitespace and newlines after each sentence in it")
    ("workers", po::value(&opt.workers)->default_value(1), "tokeniser threads")
    ("tokenizer-type", po::value(&opt.tokenizer_type)->default_value("GPT2BPETokenizer"), kTokenizerTypes)
    ("tokenizer-model", po::value(&opt.tokenizer_model),
     "HuggingFaceTokenizer: tokenizer.json; SentencePieceTokenizer / Llama2Tokenizer: tokenizer.model")
    ("vocab-file", po::value(&opt.vocab_file),
     "GPT2BPETokenizer: gpt2-vocab.json (default: assets/gpt2); BertWordPieceLowerCase / BertWordPieceCase: vocab.txt")
    ("merge-file", po::value(&opt.merge_file), "GPT2BPETokenizer: gpt2-merges.txt (default: assets/gpt2)")
    ("log-interval", po::value(&opt.log_interval)->default_value(100000), "progress line every N documents")
    ("on-error", po::value(&opt.on_error)->default_value("fail"),
     "bad JSON / missing key / invalid UTF-8 line: 'fail' (stop, naming the line) or 'skip' (skip and count)")
    ("chunk-mb", po::value(&opt.chunk_mb)->default_value(16), "MB of input read per step (bounds memory; fractions allowed)")
    // Megatron flags accepted for compatibility.
    ("partitions", po::value<int>()->default_value(1), "must be 1")
    ("keep-sequential-samples", po::bool_switch(), "no effect: output is always in input order")
    ("dataset-impl", po::value<std::string>()->default_value("mmap"), "must be mmap")
    // Megatron flags not built in mpitron (rejected with a message).
    ("lang", po::value<std::string>()->default_value("english"),
     "--split-sentences language: only 'english' (the rule-based splitter; Megatron's NLTK punkt language)")
    ("vocab-size", po::value<int64_t>(), "not built")
    ("vocab-extra-ids", po::value<int64_t>(), "not built");
  // clang-format on
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    if (vm["keep-newlines"].as<bool>() && !vm["split-sentences"].as<bool>())
      MPT_THROW("--keep-newlines works only with --split-sentences", "add --split-sentences, or drop --keep-newlines");
    if (vm["lang"].as<std::string>() != "english")
      MPT_THROW(str("--lang ", vm["lang"].as<std::string>(), " is not built in mpitron"),
                "the sentence splitter's rules are for English (docs/data.md); drop --lang");
    for (const char* flag : {"vocab-size", "vocab-extra-ids"})
      if (vm.count(flag))
        MPT_THROW(str("--", flag, " is not built in mpitron"), "drop the flag");
    if (vm["partitions"].as<int>() != 1)
      MPT_THROW("--partitions > 1 is not built in mpitron", "use --workers for parallelism; the output is one file");
    if (vm["dataset-impl"].as<std::string>() != "mmap")
      MPT_THROW(str("--dataset-impl ", vm["dataset-impl"].as<std::string>(), " is not built in mpitron"),
                "only the mmap format (MMIDIDX) is written");
    po::notify(vm);
    return run(opt);
  } catch (const po::error& e) {
    std::cerr << "preprocess_data: " << e.what() << "\n(see --help)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "preprocess_data: " << e.what() << "\n";
    return 1;
  }
}
