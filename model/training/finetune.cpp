#include "model/training/finetune.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/files.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "model/flags/flag_given.h"
#include "model/flags/model_flags.h"
#include "model/arch_fields.h"
#include "model/checkpoint/checkpointing.h"
#include "model/training/parallel_runtime.h"
#include "model/training/trainer.h"

namespace mpitron {

// ---------------------------------------------------------------- tasks and data

std::string clean_text(const std::string& text) {
  std::string s;  // whitespace runs (newlines included) -> one space
  bool space = false;
  for (const char ch : text) {
    if (std::isspace(static_cast<unsigned char>(ch))) {
      space = true;
      continue;
    }
    if (space) s += ' ';
    space = false;
    s += ch;
  }
  if (space) s += ' ';
  for (int k = 0; k < 3; ++k) {  // Python's str.replace(' . ', '. '): non-overlapping, left to right
    std::string out;
    size_t i = 0;
    while (i < s.size()) {
      if (s.compare(i, 3, " . ") == 0) {
        out += ". ";
        i += 3;
      } else {
        out += s[i++];
      }
    }
    s = out;
  }
  return s;
}

namespace {

std::string strip(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> split_tabs(const std::string& s) {
  std::vector<std::string> v;
  size_t at = 0;
  for (;;) {
    const size_t t = s.find('\t', at);
    v.push_back(s.substr(at, t == std::string::npos ? std::string::npos : t - at));
    if (t == std::string::npos) return v;
    at = t + 1;
  }
}

const std::vector<std::string> kMnliLabels{"contradiction", "entailment", "neutral"};

}  // namespace

std::vector<ClassificationExample> read_mnli_tsv(const std::string& path, const std::string& test_label) {
  LineReader f(path, "MNLI file");
  auto label_of = [&](const std::string& l, const std::string& where) {
    const auto it = std::find(kMnliLabels.begin(), kMnliLabels.end(), l);
    MPT_CHECK(it != kMnliLabels.end(), str(where, ": MNLI label '", l, "' is not contradiction, entailment or neutral"),
              "MNLI's gold_label is the last column; unlabelled rows ('-') are not accepted (as Megatron)");
    return static_cast<int32_t>(it - kMnliLabels.begin());
  };
  std::vector<ClassificationExample> out;
  std::string line;
  int64_t lineno = 0;
  bool is_test = false;
  while (f.next(line)) {
    lineno = f.line_no();
    const std::string where = str(path, ":", lineno);
    // Text the tokenizer would read as U+FFFD: refused, as preprocess_data refuses it.
    const int64_t bad = data::find_invalid_utf8(line);
    MPT_CHECK(bad < 0, str(where, ": invalid UTF-8 at byte ", bad), "convert the file to UTF-8");
    const std::vector<std::string> row = split_tabs(strip(line));
    if (lineno == 1) {  // the header; 10 columns: a test file, no gold_label
      MPT_CHECK(row.size() >= 10, str(where, ": an MNLI header has at least 10 tab-separated columns, found ", row.size()),
                "the GLUE MNLI layout: index ... sentence1 (column 8) sentence2 (column 9) ... gold_label (last)");
      // A file without its header row would lose its first example here, without a word: the header is
      // recognised by its column names, and a first line that is not one is refused.
      const std::string c0 = strip(row[0]), c8 = strip(row[8]), c9 = strip(row[9]);
      const bool example = !c0.empty() && std::all_of(c0.begin(), c0.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      });
      MPT_CHECK(c8 == "sentence1" && c9 == "sentence2",
                example ? str(where, ": the file has no header row: its first line is an example (index ", c0,
                              "), which would be skipped as the header")
                        : str(where, ": the first line is not MNLI's header row (columns 8 and 9 are '", c8, "' and '",
                              c9, "', not sentence1 and sentence2)"),
                "GLUE's MNLI files start with the header \"index promptID pairID genre ... sentence1 sentence2 ... "
                "gold_label\": restore it (or add one) as the first line");
      is_test = row.size() == 10;
      MPT_CHECK(!is_test || !test_label.empty(),
                str(where, ": a 10-column MNLI file is a GLUE test file: it has no gold_label column"),
                "--train-data and --valid-data need labelled files (train.tsv, dev_matched.tsv, dev_mismatched.tsv)");
      continue;
    }
    MPT_CHECK(row.size() >= 10, str(where, ": ", row.size(), " columns, MNLI rows have at least 10"), "");
    ClassificationExample ex;
    ex.text_a = clean_text(strip(row[8]));
    ex.text_b = clean_text(strip(row[9]));
    MPT_CHECK(!ex.text_a.empty() && !ex.text_b.empty(), str(where, ": empty sentence1 or sentence2"), "");
    const std::string id = strip(row[0]);
    MPT_CHECK(!id.empty() && std::all_of(id.begin(), id.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }),
              str(where, ": the id column '", id, "' is not a non-negative integer"), "");
    ex.uid = std::stoll(id);
    ex.label = label_of(is_test ? test_label : strip(row.back()), where);
    out.push_back(std::move(ex));
  }
  MPT_CHECK(lineno > 0, str(path, " is empty"), "an MNLI file starts with a header row");
  return out;
}

const std::vector<ClassificationTask>& classification_tasks() {
  static const std::vector<ClassificationTask> tasks{
      {"MNLI", kMnliLabels, [](const std::string& p) { return read_mnli_tsv(p); }},
  };
  return tasks;
}

const ClassificationTask& find_classification_task(const std::string& name) {
  std::string known;
  for (const ClassificationTask& t : classification_tasks()) {
    if (t.name == name) return t;
    known += (known.empty() ? "" : ", ") + t.name;
  }
  MPT_THROW(str("--task ", name, " is not a task finetune knows; known tasks: ", known),
            "docs/finetune.md \"Adding a sequence-classification task\"");
}

ClassificationSample build_classification_sample(const std::vector<int32_t>& ids_a, const std::vector<int32_t>* ids_b,
                                                 int64_t seq_length, int32_t cls, int32_t sep, int32_t pad) {
  MPT_CHECK(seq_length >= 2, str("--seq-length ", seq_length, " cannot hold [CLS] and [SEP]"), "");
  ClassificationSample s;
  std::vector<int32_t>& ids = s.tokens;
  std::vector<int32_t>& types = s.types;
  ids.push_back(cls), types.push_back(0);
  ids.insert(ids.end(), ids_a.begin(), ids_a.end()), types.insert(types.end(), ids_a.size(), 0);
  ids.push_back(sep), types.push_back(0);
  if (ids_b) ids.insert(ids.end(), ids_b->begin(), ids_b->end()), types.insert(types.end(), ids_b->size(), 1);
  bool trimmed = false;
  if (static_cast<int64_t>(ids.size()) >= seq_length) {  // keep seq_length − 1, the last [SEP] goes after
    ids.resize(static_cast<size_t>(seq_length - 1));
    types.resize(ids.size());
    trimmed = true;
  }
  if (ids_b || trimmed) ids.push_back(sep), types.push_back(ids_b ? 1 : 0);
  s.length = static_cast<int32_t>(ids.size());
  ids.resize(static_cast<size_t>(seq_length), pad);
  types.resize(ids.size(), 0);
  return s;
}

ClassificationSample build_classification_sample(const data::TextTokenizer& tok, const ClassificationExample& ex,
                                                 int64_t seq_length) {
  const auto enc = tok.make_encoder(false);
  const std::vector<int32_t> a = enc->encode(ex.text_a);
  const std::vector<int32_t> b = ex.text_b.empty() ? std::vector<int32_t>{} : enc->encode(ex.text_b);
  ClassificationSample s =
      build_classification_sample(a, ex.text_b.empty() ? nullptr : &b, seq_length, tok.cls(), tok.sep(), tok.pad());
  s.label = ex.label;
  s.uid = ex.uid;
  return s;
}

BertBatch classification_batch(const std::vector<const ClassificationSample*>& samples) {
  MPT_CHECK(!samples.empty(), "classification_batch: no samples", "");
  const int64_t B = static_cast<int64_t>(samples.size()), T = static_cast<int64_t>(samples[0]->tokens.size());
  std::vector<int64_t> tok, typ, len, lab;
  for (const ClassificationSample* s : samples) {
    MPT_CHECK(static_cast<int64_t>(s->tokens.size()) == T, "classification_batch: samples of different lengths", "");
    tok.insert(tok.end(), s->tokens.begin(), s->tokens.end());
    typ.insert(typ.end(), s->types.begin(), s->types.end());
    len.push_back(s->length);
    lab.push_back(s->label);
  }
  BertBatch b;
  b.tokens = Tensor::from_ints(tok, {B, T}, DType::I32);
  b.types = Tensor::from_ints(typ, {B, T}, DType::I32);
  b.lengths = Tensor::from_ints(len, {B}, DType::I32);
  b.class_labels = Tensor::from_ints(lab, {B}, DType::I32);
  b.is_random = Tensor::zeros({B}, DType::I32);
  return b;
}

// ---------------------------------------------------------------- --pretrained-checkpoint

PretrainedLoad load_pretrained_encoder(const std::string& dir, GPT& model, MPI_Comm comm, const std::string& tokenizer,
                                       bool allow_tokenizer_change) {
  const GPTConfig& c = model.config();
  const ParamSet& ps = model.params();
  std::vector<float> values;
  PretrainedLoad res;
  io::CheckpointReader r = io::CheckpointReader::load_latest(dir, comm, [&](const io::CheckpointReader& ck) {
    const GPTConfig saved = config_from_json(ck.attr_json("model_config"), ck.path());
    // Every Shape and Choice field but the heads', which fine-tuning replaces.
    const std::string diff =
        field_differences(c, saved, {FieldKind::Shape, FieldKind::Choice}, {"binary_head", "num_tokentypes", "num_classes"});
    MPT_CHECK(saved.bert, str("--pretrained-checkpoint ", ck.path(), " is not a BERT checkpoint (family ", saved.family(), ")"),
              "fine-tune a checkpoint saved by pretrain_bert");
    MPT_CHECK(diff.empty(), str("--pretrained-checkpoint ", ck.path(), " has another model shape than the flags: ", diff),
              "pass the model flags the checkpoint was pretrained with");
    if (!tokenizer.empty())
      check_checkpoint_tokenizer(str("--pretrained-checkpoint ", ck.path()),
                                 ck.has_attr("tokenizer_identity") ? ck.attr_string("tokenizer_identity") : "",
                                 saved.vocab_size, tokenizer, c.vocab_size, allow_tokenizer_change);
    values.assign(static_cast<size_t>(ps.numel()), 0.0f);
    res = PretrainedLoad{};
    res.path = ck.path();
    std::vector<io::ReadRequest> reqs;
    for (const ParamInfo& p : ps.infos()) {
      if (p.role == ParamRole::ClassificationHeadWeight || p.role == ParamRole::ClassificationHeadBias ||
          !ck.has_tensor("model/" + p.name)) {
        res.fresh.push_back(p.name);
        continue;
      }
      std::vector<io::Hdf5File::Hyperslab> slabs;
      for (const GlobalPiece& g : global_pieces(p, 0, p.numel())) slabs.push_back({g.start, g.count});
      reqs.push_back({"model/" + p.name, slabs, values.data() + p.offset, io::ElemType::F32, p.global_shape});
      res.loaded.push_back(p.name);
    }
    ck.read_verified(reqs, io::VerifyScope::RequestedDatasets);
  });
  MPT_CHECK(r.found(), str("--pretrained-checkpoint ", dir, " holds no checkpoint"),
            "give the --save directory of a pretraining run");
  // Only the loaded parameters change: copy their ranges into the values.
  std::vector<float> now = ps.values().to(Device::cpu()).to(DType::F32).to_floats();
  for (const std::string& name : res.loaded) {
    const ParamInfo& p = ps.info(name);
    std::copy(values.begin() + p.offset, values.begin() + p.offset + p.numel(), now.begin() + p.offset);
  }
  ps.values().copy_from(Tensor::from_vector(now, {ps.numel()}).to(ps.values().dtype()).to(model.device()));
  return res;
}

// ---------------------------------------------------------------- flags

bool parse_finetune_args(int argc, char** argv, FinetuneArgs& a) {
  namespace po = boost::program_options;
  int64_t vpp = 0;
  bool sequence_parallel = false, distributed_optimizer = false;
  GPTConfig& m = a.model;
  m = GPTConfig{};
  m.num_layers = 2, m.hidden_size = 64, m.num_attention_heads = 4, m.seq_length = 128, m.max_position_embeddings = 512;
  po::options_description d("finetune: fine-tune a pretrained BERT on a classification task (Megatron's tasks/main.py)");
  d.add_options()("help,h", "print this help")
      ("task", po::value(&a.task)->required(), "the task: MNLI")
      ("train-data", po::value(&a.train_data)->multitoken()->required(), "training files of the task (one or more)")
      ("valid-data", po::value(&a.valid_data)->multitoken(), "validation files (one or more): accuracy after each epoch")
      ("pretrained-checkpoint", po::value(&a.pretrained_checkpoint), "a BERT checkpoint directory: its encoder "
       "weights (not its heads, optimizer state or iteration) start the run")
      ("epochs", po::value(&a.epochs)->default_value(3), "passes over the training files")
      ("micro-batch-size", po::value(&a.micro_batch_size)->default_value(4), "samples per micro-batch per rank")
      ("global-batch-size", po::value(&a.global_batch_size), "samples per step (default micro-batch-size x data-parallel size)")
      ("lr", po::value(&a.lr)->default_value(1e-4f, "1e-4"), "peak learning rate")
      ("min-lr", po::value(&a.min_lr)->default_value(0.0f, "0"), "learning rate at the end of the decay")
      ("lr-decay-style", po::value(&a.lr_decay_style)->default_value("linear"), "constant | linear | cosine")
      ("lr-warmup-fraction", po::value(&a.lr_warmup_fraction)->default_value(0.0f, "0"), "fraction of the steps of linear warmup")
      ("weight-decay", po::value(&a.optim.weight_decay)->default_value(0.01f, "0.01"), "AdamW weight decay")
      ("clip-grad", po::value(&a.optim.clip_grad)->default_value(1.0f, "1.0"), "global gradient-norm clip (0: none)")
      ("adam-beta1", po::value(&a.optim.beta1)->default_value(0.9f, "0.9"), "Adam beta1")
      ("adam-beta2", po::value(&a.optim.beta2)->default_value(0.999f, "0.999"), "Adam beta2")
      ("adam-eps", po::value(&a.optim.eps)->default_value(1e-8f, "1e-8"), "Adam epsilon")
      ("hidden-dropout", po::value(&m.hidden_dropout)->default_value(0.1f, "0.1"), "dropout after the embeddings, "
       "sublayers and on the pooled [CLS] (Megatron's classification dropout)")
      ("attention-dropout", po::value(&m.attention_dropout)->default_value(0.1f, "0.1"), "dropout on attention probabilities")
      ("init-method-std", po::value(&m.init_method_std)->default_value(0.02f, "0.02"), "std of the normal init")
      ("tokenizer-type", po::value(&a.tokenizer_type)->default_value("BertWordPieceLowerCase"),
       "BertWordPieceLowerCase or BertWordPieceCase")
      ("vocab-file", po::value(&a.vocab_file)->required(), "the WordPiece vocab.txt")
      ("allow-tokenizer-change", po::bool_switch(&a.allow_tokenizer_change),
       "use a --pretrained-checkpoint trained with another tokenizer (refused otherwise)")
      ("make-vocab-size-divisible-by", po::value(&a.make_vocab_size_divisible_by)->default_value(128),
       "pad the vocabulary to a multiple of this x tensor-model-parallel-size")
      ("save", po::value(&a.save), "checkpoint directory: a checkpoint after every epoch")
      ("save-interval", po::value(&a.save_interval)->default_value(0), "also save every N steps (0: only per epoch)")
      ("log-interval", po::value(&a.log_interval)->default_value(10), "steps between loss lines")
      ("eval-interval", po::value(&a.eval_interval)->default_value(0), "steps between accuracy evaluations (0: per epoch only)")
      ("seed", po::value(&a.seed)->default_value(1234), "init, shuffling and dropout seed")
      ("tensor-model-parallel-size", po::value(&a.tensor_model_parallel_size)->default_value(1), "tensor parallel ranks")
      ("pipeline-model-parallel-size", po::value(&a.pipeline_model_parallel_size)->default_value(1),
       "pipeline stages (1f1b; the pooler and classifier on the last)")
      ("num-layers-per-virtual-pipeline-stage", po::value(&vpp), "not supported by finetune")
      ("zero-stage", po::value(&a.zero_stage)->default_value(0), "0 | 1 | 2 | 3: how the model states are sharded over "
       "the data-parallel ranks (as pretrain_gpt)")
      ("use-distributed-optimizer", po::bool_switch(&distributed_optimizer), "= --zero-stage 1")
      ("bf16", po::bool_switch(&a.bf16), "bf16 compute, fp32 master weights")
      ("recompute-activations", po::bool_switch(&a.recompute_activations), "recompute each block in backward")
      ("sequence-parallel", po::bool_switch(&sequence_parallel), "not supported by finetune (the pooler reads [CLS] rows)")
      ("device", po::value(&a.device)->default_value("auto"), "auto | cpu | cuda")
      ("force-mpi-for-device", po::bool_switch(&a.force_mpi_for_device), "MPI (host-staged) collectives for GPU tensors");
  // The model shape (checked against --pretrained-checkpoint) and --bert-post-ln, from the
  // architecture table (model/arch_fields.h).
  const std::set<std::string> shape_flags{"num-layers", "hidden-size", "num-attention-heads", "ffn-hidden-size",
                                          "seq-length", "max-position-embeddings", "layernorm-epsilon", "bert-post-ln"};
  add_model_flags(d, {FlagScope::Model, FlagScope::Bert}, "Model shape (checked against --pretrained-checkpoint)",
                  [&](const ArchField&, const ArchFlag& f) { return shape_flags.count(f.name) > 0; });
  po::variables_map vm;
  try {
    const po::parsed_options parsed = po::parse_command_line(argc, argv, d);
    check_parsed_values(parsed, d, "finetune");
    po::store(parsed, vm);
    if (vm.count("help")) {
      std::ostringstream help;
      help << d;
      std::printf("%s\n", help.str().c_str());
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    MPT_THROW(str("finetune: ", e.what()), "run finetune --help for the flags it supports");
  }
  apply_model_flags(given_model_flags(vm), m, {FlagScope::Model, FlagScope::Bert});
  MPT_CHECK(a.pipeline_model_parallel_size >= 1 && a.pipeline_model_parallel_size <= m.num_layers &&
                m.num_layers % a.pipeline_model_parallel_size == 0,
            str("--pipeline-model-parallel-size ", a.pipeline_model_parallel_size, " does not divide --num-layers ",
                m.num_layers), "pick a divisor of the layer count");
  MPT_CHECK(a.zero_stage >= 0 && a.zero_stage <= 3, str("--zero-stage ", a.zero_stage, " is not 0, 1, 2 or 3"), "");
  MPT_CHECK(!distributed_optimizer || a.zero_stage <= 1,
            str("--use-distributed-optimizer (ZeRO-1) and --zero-stage ", a.zero_stage, " were both given"), "pick one");
  if (distributed_optimizer) a.zero_stage = 1;
  MPT_CHECK(a.zero_stage != 2 || a.pipeline_model_parallel_size == 1,
            "--zero-stage 2 is not available with --pipeline-model-parallel-size > 1",
            "use --zero-stage 1 or 3 with pipeline parallelism");
  MPT_CHECK(vpp == 0, "--num-layers-per-virtual-pipeline-stage is not supported by finetune", "leave it out");
  MPT_CHECK(!sequence_parallel, "--sequence-parallel is not supported by finetune (the pooler reads the [CLS] rows)",
            "leave it out");
  find_classification_task(a.task);
  MPT_CHECK(a.epochs >= 1, str("--epochs must be >= 1, got ", a.epochs), "");
  MPT_CHECK(a.micro_batch_size >= 1, str("--micro-batch-size must be >= 1, got ", a.micro_batch_size), "");
  MPT_CHECK(a.log_interval >= 1, str("--log-interval must be >= 1, got ", a.log_interval), "");
  MPT_CHECK(a.tokenizer_type == "BertWordPieceLowerCase" || a.tokenizer_type == "BertWordPieceCase",
            str("--tokenizer-type ", a.tokenizer_type, ": finetune needs a BERT WordPiece tokenizer"),
            "BertWordPieceLowerCase or BertWordPieceCase with --vocab-file");
  m.bert = true;
  m.causal = false;
  m.num_tokentypes = 2;  // A and B (Megatron's Classification model: num_tokentypes=2)
  m.num_classes = static_cast<int64_t>(find_classification_task(a.task).labels.size());
  nlohmann::json flags = nlohmann::json::array();
  for (int i = 1; i < argc; ++i) flags.push_back(argv[i]);
  a.flags_json = flags.dump();
  return true;
}

// ---------------------------------------------------------------- the run

namespace {

struct Dataset {
  std::string name;
  std::vector<ClassificationSample> samples;
};

Dataset load_dataset(const ClassificationTask& task, const std::vector<std::string>& files, const data::TextTokenizer& tok,
                     int64_t seq_length, const std::string& name) {
  Dataset d;
  d.name = name;
  for (const std::string& f : files)
    for (const ClassificationExample& ex : task.read(f)) d.samples.push_back(build_classification_sample(tok, ex, seq_length));
  return d;
}

// The trainer's view of a task's files. Split 0: the epochs one after another, each
// the train samples in that epoch's order (a shuffle seeded seed + epoch, Megatron's),
// cut to whole global batches (drop_last); split 1: the --valid-data files one after
// another, each an evaluation set counted for accuracy.
class TaskSamples final : public ClassificationSource {
 public:
  TaskSamples(Dataset train, std::vector<Dataset> valid, int64_t epoch_samples, int64_t epochs, uint64_t seed)
      : train_(std::move(train)), valid_(std::move(valid)), epoch_samples_(epoch_samples) {
    const int64_t n = static_cast<int64_t>(train_.samples.size());
    for (int64_t e = 0; e < epochs; ++e) {
      std::vector<int64_t> order(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
      std::mt19937_64 rng(seed + static_cast<uint64_t>(e));
      for (int64_t i = n - 1; i > 0; --i)
        std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(rng() % static_cast<uint64_t>(i + 1))]);
      orders_.push_back(std::move(order));
    }
    for (const Dataset& d : valid_) {
      sets_.push_back({d.name, valid_total_, static_cast<int64_t>(d.samples.size())});
      valid_total_ += static_cast<int64_t>(d.samples.size());
    }
  }
  int64_t num_samples(int split) const override {
    return split == 0 ? epoch_samples_ * static_cast<int64_t>(orders_.size()) : split == 1 ? valid_total_ : 0;
  }
  void classification_sample(int split, int64_t index, ClassificationSample& out) const override {
    if (split == 0) {
      const std::vector<int64_t>& order = orders_.at(static_cast<size_t>(index / epoch_samples_));
      out = train_.samples[static_cast<size_t>(order[static_cast<size_t>(index % epoch_samples_)])];
      return;
    }
    MPT_CHECK(split == 1, "finetune has no test split", "");
    for (const Dataset& d : valid_) {
      if (index < static_cast<int64_t>(d.samples.size())) {
        out = d.samples[static_cast<size_t>(index)];
        return;
      }
      index -= static_cast<int64_t>(d.samples.size());
    }
    MPT_THROW(str("validation sample ", index, " is past the end"), "this is a bug in the caller");
  }
  std::vector<EvalSet> eval_sets() const override { return sets_; }

 private:
  Dataset train_;
  std::vector<Dataset> valid_;
  int64_t epoch_samples_;
  std::vector<std::vector<int64_t>> orders_;
  std::vector<EvalSet> sets_;
  int64_t valid_total_ = 0;
};

}  // namespace

FinetuneResult run_finetune(const FinetuneArgs& args, MPI_Comm world) {
  const ClassificationTask& task = find_classification_task(args.task);
  int world_size = 1;
  MPI_Comm_size(world, &world_size);
  TrainArgs ta;  // the trainer's flags: this run's layout, batch, schedule, precision
  ta.tensor_model_parallel_size = args.tensor_model_parallel_size;
  ta.pipeline_model_parallel_size = args.pipeline_model_parallel_size;
  const int64_t mp = ta.tensor_model_parallel_size * ta.pipeline_model_parallel_size;
  MPT_CHECK(world_size % mp == 0,
            str("the world of ", world_size, " ranks is not a multiple of --tensor-model-parallel-size x "
                "--pipeline-model-parallel-size = ", mp), "launch a multiple of that many ranks");
  ta.world_size = world_size;
  ta.data_parallel_size = world_size / mp;
  ta.device = args.device;
  ta.force_mpi_for_device = args.force_mpi_for_device;
  ParallelRuntime rt(world, ta);
  int world_rank = 0;
  MPI_Comm_rank(world, &world_rank);
  const bool printer = world_rank == 0;

  data::TokenizerSpec spec;
  spec.type = args.tokenizer_type;
  spec.vocab_file = args.vocab_file;
  const std::unique_ptr<data::TextTokenizer> tok = data::make_tokenizer(spec);
  const std::string tokenizer_identity = data::tokenizer_identity(spec, *tok).dump();
  GPTConfig cfg = args.model;
  cfg.vocab_size = tok->vocab_size();
  const int64_t mult = args.make_vocab_size_divisible_by * ta.tensor_model_parallel_size;
  cfg.padded_vocab_size = (cfg.vocab_size + mult - 1) / mult * mult;
  if (args.bf16) cfg.compute_dtype = DType::BF16;
  cfg.validate();

  Dataset train = load_dataset(task, args.train_data, *tok, cfg.seq_length, "train");
  std::vector<Dataset> valid;
  for (const std::string& f : args.valid_data)
    valid.push_back(load_dataset(task, {f}, *tok, cfg.seq_length, std::filesystem::path(f).filename().string()));

  const int64_t dp = ta.data_parallel_size, mbs = args.micro_batch_size;
  const int64_t gbs = args.global_batch_size > 0 ? args.global_batch_size : mbs * dp;
  MPT_CHECK(gbs % (mbs * dp) == 0,
            str("--global-batch-size ", gbs, " is not a multiple of --micro-batch-size ", mbs, " x data-parallel size ", dp), "");
  const int64_t n_train = static_cast<int64_t>(train.samples.size());
  const int64_t steps_per_epoch = n_train / gbs;  // drop_last
  MPT_CHECK(steps_per_epoch >= 1, str("--train-data has ", n_train, " samples, fewer than a global batch of ", gbs), "");
  const int64_t total_steps = steps_per_epoch * args.epochs;

  ta.model = cfg;
  ta.optim = args.optim;
  ta.micro_batch_size = mbs;
  ta.global_batch_size = gbs;
  ta.train_iters = total_steps;
  ta.epoch_iters = steps_per_epoch;
  ta.lr = args.lr;
  ta.min_lr = args.min_lr;
  ta.lr_decay_style = args.lr_decay_style;
  ta.lr_warmup_fraction = args.lr_warmup_fraction;
  ta.bf16 = args.bf16;
  ta.recompute_activations = args.recompute_activations;
  ta.zero_stage = args.zero_stage;
  ta.seed = args.seed;
  ta.log_interval = args.log_interval;
  ta.eval_interval = args.eval_interval;
  ta.eval_iters = 0;  // evaluation is accuracy over the whole --valid-data files
  ta.save = args.save;
  ta.save_interval = args.save_interval;
  ta.tokenizer_identity = tokenizer_identity;
  ta.allow_tokenizer_change = args.allow_tokenizer_change;
  ta.flags_json = args.flags_json;
  if (printer)
    std::printf(" > finetune %s: %s; %lld train samples, %lld steps per epoch x %lld epochs (global batch %lld), "
                "%lld parameters\n",
                task.name.c_str(), rt.describe().c_str(), static_cast<long long>(n_train),
                static_cast<long long>(steps_per_epoch), static_cast<long long>(args.epochs),
                static_cast<long long>(gbs), static_cast<long long>(cfg.num_parameters()));
  std::fflush(stdout);

  auto source = std::make_shared<TaskSamples>(std::move(train), std::move(valid), steps_per_epoch * gbs, args.epochs,
                                              args.seed);
  // --pretrained-checkpoint: the encoder's weights over the init, before any sharding.
  auto pretrained = [&](GPT& core) {
    if (args.pretrained_checkpoint.empty()) return;
    const PretrainedLoad l = load_pretrained_encoder(args.pretrained_checkpoint, core, world_size > 1 ? world : MPI_COMM_NULL,
                                                     tokenizer_identity, args.allow_tokenizer_change);
    std::string fresh;
    for (const std::string& n : l.fresh) fresh += " " + n;
    log_info("loaded the encoder from ", l.path, " (", l.loaded.size(), " tensors); initialised fresh:", fresh);
  };
  Trainer trainer(ta, source, rt.context(), pretrained);
  const TrainSummary sum = trainer.run();
  FinetuneResult res;
  res.losses = sum.losses;
  res.accuracies = sum.accuracies;
  res.steps = sum.iterations;
  return res;
}

}  // namespace mpitron
