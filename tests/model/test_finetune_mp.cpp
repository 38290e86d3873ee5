// mpitron-test: np=2
// tests/model/test_finetune_mp.cpp — fine-tuning (model/training/finetune.h) under tensor
// parallelism 2 equals one process, and pretrained checkpoints load across layouts:
//  - a BERT checkpoint saved under TP 2 gives a one-process classifier the same encoder
//    values as the one-process model it came from; a one-process checkpoint loads under TP 2;
//  - run_finetune at TP 2 (from a pretrained checkpoint, with dropout) logs the losses of
//    one process within 1e-5 at every step, and the same dev accuracy.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>

#include "model/training/adamw_checkpoint.h"
#include "model/training/finetune.h"
#include "parallel/communicator.h"
#include "tests/data/data_test_util.h"
#include "tests/model/mpi_test_util.h"

using namespace mpitron;
namespace fs = std::filesystem;

namespace {

const std::string kVocab = testing::source_path("tests/data/ref/bert_uncased/vocab.txt");

GPTConfig pretrain_config() {
  GPTConfig c;
  c.bert = true;
  c.causal = false;
  c.num_tokentypes = 2;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 24;
  c.max_position_embeddings = 32;
  c.vocab_size = 2002;        // the test vocab + [BOS] [EOS] (data/wordpiece_tokenizer.h)
  c.padded_vocab_size = 2048;  // 128 x 2 (TP 2) and 128 x 1 give the same size
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  return c;
}

}  // namespace

TEST_CASE("finetune: pretrained checkpoints load across TP layouts") {
  REQUIRE(testing::world_size() == 2);
  const int rank = testing::world_rank();
  const fs::path dir = testing::shared_dir("ft_mp_load");
  if (rank == 0) fs::remove_all(dir), fs::create_directories(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  auto comm = make_mpi_communicator(MPI_COMM_WORLD);
  const GPTConfig pc = pretrain_config();
  GPTConfig cc = pc;
  cc.num_classes = 3;
  // Saved under TP 2.
  ModelParallel mp;
  mp.tp = TensorParallel{comm.get(), 2, rank, false};
  {
    Bert m(pc, Device::cpu(), mp);
    m.init_weights(11);
    ReplicatedOptimizer opt(m.params(), OptimizerConfig{});
    TrainState st;
    save_checkpoint((dir / "tp2").string(), m.core(), OptimState{opt.master(), opt.exp_avg(), opt.exp_avg_sq(), 0, 0},
                    LossScaler(), st, "[]", "{}", 0, MPI_COMM_WORLD, true);
  }
  if (rank == 0) {
    Bert ref(pc, Device::cpu());  // the one-process model of the same seed
    ref.init_weights(11);
    const std::vector<float> rv = ref.params().values().to_floats();
    ReplicatedOptimizer opt(ref.params(), OptimizerConfig{});
    save_checkpoint((dir / "one").string(), ref.core(), opt, LossScaler(), TrainState{}, "[]", "{}");
    Bert m(cc, Device::cpu());
    m.init_weights(99);
    const PretrainedLoad l = load_pretrained_encoder((dir / "tp2").string(), m.core());
    CHECK(l.fresh.size() == 2);
    const std::vector<float> v = m.params().values().to_floats();
    for (const std::string& name : l.loaded) {
      CAPTURE(name);
      const ParamInfo& p = m.params().info(name);
      const ParamInfo& q = ref.params().info(name);
      int64_t same = 0;
      for (int64_t i = 0; i < p.numel(); ++i) same += v[static_cast<size_t>(p.offset + i)] == rv[static_cast<size_t>(q.offset + i)];
      CHECK(same == p.numel());
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // A one-process checkpoint under TP 2: each rank's slice of the saved tensors.
  Bert m(cc, Device::cpu(), mp);
  m.init_weights(99);
  load_pretrained_encoder((dir / "one").string(), m.core(), MPI_COMM_WORLD);
  Bert ref(pc, Device::cpu());
  ref.init_weights(11);
  const std::vector<float> v = m.params().values().to_floats(), rv = ref.params().values().to_floats();
  int64_t differ = 0;
  for (const ParamInfo& p : m.params().infos()) {
    if (p.role == ParamRole::ClassificationHeadWeight || p.role == ParamRole::ClassificationHeadBias) continue;
    const ParamInfo& q = ref.params().info(p.name);
    for (int64_t i = 0; i < p.numel(); ++i)
      differ += v[static_cast<size_t>(p.offset + i)] != rv[static_cast<size_t>(q.offset + global_element(p, i))];
  }
  CHECK(differ == 0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(dir);
}

TEST_CASE("finetune: TP2, DP2 ZeRO-3 and PP2 log the one-process losses within 1e-5") {
  const int rank = testing::world_rank();
  const fs::path dir = testing::shared_dir("ft_mp_run");
  if (rank == 0) {
    fs::remove_all(dir), fs::create_directories(dir);
    Bert pre(pretrain_config(), Device::cpu());
    pre.init_weights(11);
    ReplicatedOptimizer opt(pre.params(), OptimizerConfig{});
    save_checkpoint((dir / "bert").string(), pre.core(), opt, LossScaler(), TrainState{}, "[]", "{}");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  FinetuneArgs a;
  a.task = "MNLI";
  a.train_data = {testing::source_path("tests/data/finetune/train.tsv")};
  a.valid_data = {testing::source_path("tests/data/finetune/dev_matched.tsv")};
  a.pretrained_checkpoint = (dir / "bert").string();
  a.vocab_file = kVocab;
  a.model = pretrain_config();
  a.model.num_classes = 3;
  a.model.hidden_dropout = 0.1f;  // masks named by (seed, step, micro-batch, element): the same under TP
  a.model.attention_dropout = 0.1f;
  a.epochs = 1;
  a.micro_batch_size = 8;
  a.global_batch_size = 16;
  a.lr = 1e-3f;
  a.log_interval = 25;
  a.seed = 3;
  a.device = "cpu";
  a.make_vocab_size_divisible_by = 64;  // 64 x 2 = 128: 2048 as in the checkpoint
  FinetuneResult one;
  if (rank == 0) {
    FinetuneArgs b = a;
    b.make_vocab_size_divisible_by = 128;
    one = run_finetune(b, MPI_COMM_SELF);
  }
  // The trainer's layouts (finetune runs on its loop): TP2, DP2 under ZeRO-3, PP2.
  struct Layout {
    std::string name;
    int64_t tp, pp, zero;
  };
  for (const Layout& l : {Layout{"TP2", 2, 1, 0}, Layout{"DP2 ZeRO-3", 1, 1, 3}, Layout{"PP2", 1, 2, 0}}) {
    FinetuneArgs b = a;
    b.tensor_model_parallel_size = l.tp;
    b.pipeline_model_parallel_size = l.pp;
    b.zero_stage = l.zero;
    if (l.tp == 1) b.make_vocab_size_divisible_by = 128;
    const FinetuneResult r = run_finetune(b, MPI_COMM_WORLD);
    if (rank != 0) continue;
    REQUIRE(r.losses.size() == one.losses.size());
    REQUIRE(r.losses.size() == 1200 / 16);
    double worst = 0;
    for (size_t i = 0; i < r.losses.size(); ++i) worst = std::max(worst, std::fabs(r.losses[i] - one.losses[i]));
    MESSAGE(l.name, " vs one process: largest loss difference ", worst, " over ", r.losses.size(), " steps; accuracy ",
            r.accuracies.back(), " vs ", one.accuracies.back());
    CHECK(worst < 1e-5);
    CHECK(r.accuracies == one.accuracies);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(dir);
}
