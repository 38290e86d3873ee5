// pretrain_bert's trainer with real MPI ranks: a small BERT (bidirectional
// attention, padded samples, MLM + sentence-order heads, hidden and attention
// dropout 0.1) trains 10 steps on the bundled sentence data (tests/data/ref/bert_ds,
// uncased WordPiece vocab) under TP, PP (1F1B and zero-bubble), DP and ZeRO, and
// must give the single-process lm and sop losses and grad norms within 1e-5
// relative (fp32). Replicated parameters stay bitwise equal across TP ranks.
// mpitron-test: np=2,4
// mpitron-test: timeout=900
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <sstream>
#include <filesystem>

#include "data/wordpiece_tokenizer.h"
#include "model/training/arguments.h"
#include "model/training/bert_data.h"
#include "model/training/parallel_runtime.h"
#include "model/training/trainer.h"
#include "tests/data/data_test_util.h"
#include "tests/model/mpi_test_util.h"

using namespace mpitron;
namespace fs = std::filesystem;

namespace {

using testing::world_rank;
using testing::world_size;

std::string vocab() { return testing::source_path("tests/data/ref/bert_uncased/vocab.txt"); }

// MPITRON_TEST_DEVICE=cuda runs the same layouts on the GPU (tools/gpu_check.sh; the
// cuDNN graph with BERT's padding mask): the ranks share one GPU, so MPI carries the tensors.
std::string test_device() {
  const char* d = std::getenv("MPITRON_TEST_DEVICE");
  return d && *d ? d : "cpu";
}

std::vector<std::string> flags(bool binary_head = true) {
  std::vector<std::string> f = {
      "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
      "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "10",
      "--lr", "2e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "linear", "--hidden-dropout", "0.1",
      "--attention-dropout", "0.1", "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", vocab(),
      "--data-path", testing::source_path("tests/data/ref/bert_ds/wiki_text_sentence"), "--split", "90,10,0",
      "--log-interval", "5", "--eval-interval", "5", "--eval-iters", "1", "--seed", "7", "--device", test_device(),
      "--ddp-bucket-size", "5000", "--make-vocab-size-divisible-by", "64"};
  if (!binary_head) f.push_back("--bert-no-binary-head");
#if !defined(MPITRON_CUDA_SIM)  // (the simulated device: one per rank, NCCL's stand-in)
  if (test_device() == "cuda") f.push_back("--force-mpi-for-device");
#endif
  return f;
}

struct Result {
  std::vector<double> lm, sop, grad_norms;
  double valid_loss = 0;
};

Result run(std::vector<std::string> f, MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  TrainArgs a;
  a.model.bert = true;
  a.world_size = size;
  std::vector<char*> argv{const_cast<char*>("pretrain_bert")};
  for (auto& s : f) argv.push_back(s.data());
  REQUIRE(parse_train_args(static_cast<int>(argv.size()), argv.data(), a));
  const data::WordPieceTokenizer tok(vocab(), true);
  a.model.vocab_size = tok.vocab_size();
  a.model.padded_vocab_size = (tok.vocab_size() + 127) / 128 * 128;  // 64 x TP 2 = 128 at every layout
  const std::shared_ptr<SampleSource> data = make_bert_data(a, tok);
  ParallelRuntime rt(comm, a);
  Trainer t(a, data, rt.context());
  const TrainSummary s = t.run();
  if (rt.grid().tp_size() > 1) testing::check_tp_replicas_identical(t.model().params(), rt.grid().tp_comm());
  REQUIRE(s.lm_losses.size() == s.losses.size());
  for (size_t i = 0; i < s.losses.size(); ++i)  // the trained loss is the sum of the two
    CHECK(std::abs(s.losses[i] - (s.lm_losses[i] + s.sop_losses[i])) <= 1e-6 * std::abs(s.losses[i]));
  return {s.lm_losses, s.sop_losses, s.grad_norms, s.valid_loss};
}

// The single-process reference: rank 0 trains it (alone, on MPI_COMM_SELF) and
// the other ranks receive its numbers — every rank training the same model only
// cost CPU time, the ranks sharing few cores.
Result single_process(const std::vector<std::string>& f) {
  Result r;
  if (world_rank() == 0) r = run(f, MPI_COMM_SELF);
  const auto bcast = [](std::vector<double>& v) {
    int n = static_cast<int>(v.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    v.resize(static_cast<size_t>(n));
    MPI_Bcast(v.data(), n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  };
  bcast(r.lm);
  bcast(r.sop);
  bcast(r.grad_norms);
  MPI_Bcast(&r.valid_loss, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return r;
}

void check_series(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK_MESSAGE(std::abs(got[i] - want[i]) <= 1e-5 * std::abs(want[i]) + 1e-12, what, " iteration ", i + 1, ": ",
                  got[i], " vs ", want[i]);
    if (want[i] != 0) worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  }
  if (world_rank() == 0) MESSAGE(what, ": largest relative difference over 10 steps ", worst);
}

void check_close(const Result& got, const Result& want, const std::string& what) {
  check_series(got.lm, want.lm, what + " lm loss");
  check_series(got.sop, want.sop, what + " sop loss");
  check_series(got.grad_norms, want.grad_norms, what + " grad norm");
  CHECK_MESSAGE(std::abs(got.valid_loss - want.valid_loss) <= 1e-5 * std::abs(want.valid_loss), what,
                " validation loss ", got.valid_loss, " vs ", want.valid_loss);
}

struct Layout {
  int ranks;
  bool binary_head;
  std::vector<std::string> extra;
};

}  // namespace

TEST_CASE("pretrain_bert: every kind of layout gives the single-process lm and sop losses") {
  const int world = world_size();
  const std::vector<Layout> layouts = {
      {2, true, {"--use-distributed-optimizer"}},                                  // DP2 + ZeRO-1
      {2, true, {"--zero-stage", "2"}},                                             // DP2 + ZeRO-2
      {2, true, {"--pipeline-model-parallel-size", "2"}},                          // PP2 1F1B, tied wte on both ends
      {2, true, {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"}},  // split backward
      {2, true, {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zbv",
                 "--num-layers-per-virtual-pipeline-stage", "1"}},                  // V: both ends on rank 0
      {2, false, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},    // TP2 + SP, no binary head
      {4, true, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}},  // TP2 x PP2
      {4, true, {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer", "--recompute-activations"}},
      {4, true, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                 "--use-distributed-optimizer"}},                                   // interleaved PP2 x DP2
      {2, true, {"--zero-stage", "3"}},  // DP2 + ZeRO-3 (last: the simulated device's index 3 stays zb-h1)
  };
  // MPITRON_BERT_TEST_LAYOUTS=i,j,… runs only those layouts of this world size (0-based, in
  // the order above): the simulated device's quick set (tests/cuda_sim/run.sh).
  std::vector<int> only;
  if (const char* e = std::getenv("MPITRON_BERT_TEST_LAYOUTS"); e && *e) {
    std::stringstream ss(e);
    for (std::string tok; std::getline(ss, tok, ',');) only.push_back(std::stoi(tok));
  }
  std::vector<Layout> run_layouts;
  int index = -1;
  for (const Layout& l : layouts) {
    if (l.ranks != world) continue;
    ++index;
    if (only.empty() || std::find(only.begin(), only.end(), index) != only.end()) run_layouts.push_back(l);
  }
  std::map<bool, Result> single;
  for (bool bh : {true, false}) {
    bool needed = false;
    for (const Layout& l : run_layouts) needed |= l.binary_head == bh;
    if (!needed) continue;
    single[bh] = single_process(flags(bh));
    const Result& s = single[bh];
    REQUIRE(s.lm.size() == 10);
    CHECK(s.lm.back() < s.lm.front());
    if (bh) CHECK(s.sop.front() > 0.3);  // the two losses are both there
    else CHECK(s.sop.front() == 0.0);
  }
  int ran = 0;
  for (const Layout& l : run_layouts) {
    std::vector<std::string> f = flags(l.binary_head);
    f.insert(f.end(), l.extra.begin(), l.extra.end());
    std::string what = "bert ";
    for (const std::string& e : l.extra) what += e + " ";
    check_close(run(f, MPI_COMM_WORLD), single[l.binary_head], what);
    ++ran;
  }
  if (world > 1) CHECK(ran > 0);
  MPI_Barrier(MPI_COMM_WORLD);
}
