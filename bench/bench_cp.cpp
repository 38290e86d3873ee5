// bench/bench_cp.cpp — context parallelism on a long sequence: per-rank peak
// activation memory and step time at CP 1, 2, 4, the three comm types side by side.
//
//   mpirun -np 4 --oversubscribe build/bench/bench_cp            # T = 8192, small Llama, f32 CPU
//   mpirun -np 4 build/bench/bench_cp --device cuda --bf16 --seq 32768 --json cp.json
//
// Each row trains `--steps` optimizer steps of one sequence (micro-batch 1, mock data)
// through the library's own Trainer on the first CP ranks of the world (the others
// wait), with --context-parallel-size CP --cp-comm-type TYPE. Columns:
//   ms/step     the last step's wall time (the Trainer's tokens/s at --log-interval 1);
//   act MB      per-rank peak activation memory: the peak of live tensor bytes during
//               the run (memory_stats: every Tensor on the CPU, the caching allocator's
//               live blocks on CUDA) minus what stays live after it (weights,
//               gradients, optimizer state) — the largest over the row's ranks;
//   vs CP 1     act MB over the CP 1 row's (the target: <= about 1/3 at CP 4);
//   peak MB     the whole per-rank peak, and est MB the start-up estimate of it
//               (model/memory.h, which counts T/CP tokens and the comm type's buffers).
// Model (defaults): a Llama block (RMSNorm, SwiGLU, rope, 8 heads in 4 kv groups so
// a2a can split them over 4 ranks), 2 layers, hidden 256, ffn 1024, vocabulary 1024
// (a small head, so the logits do not hide the blocks), attention and hidden dropout 0.
// Options: --seq T --layers L --hidden C --heads H --groups G --ffn F --vocab V
// --steps S --cps 1,2,4 --types p2p,all_gather,a2a --device cpu|cuda --bf16 --json FILE.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"                         // cuda_available
#include "core/error.h"                          // mpitron::Error
#include "model/training/arguments.h"            // parse_train_args: the flags as pretrain_gpt takes them
#include "model/training/gpt_data.h"             // make_gpt_data (--mock-data)
#include "model/training/parallel_runtime.h"     // the grid and communicators of one row
#include "model/training/trainer.h"              // Trainer::run, TrainSummary
#include "tensor/tensor.h"                       // memory_stats

using namespace mpitron;

namespace {

struct Options {
  int64_t seq = 8192, layers = 2, hidden = 256, heads = 8, groups = 4, ffn = 1024, vocab = 1024, steps = 3;
  std::vector<int> cps{1, 2, 4};
  std::vector<std::string> types{"p2p", "all_gather", "a2a"};
  std::string device = "cpu", json;
  bool bf16 = false;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) v.push_back(t);
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      MPT_CHECK(i + 1 < argc, str(a, " needs a value"), "");
      return argv[++i];
    };
    if (a == "--seq") o.seq = std::stoll(next());
    else if (a == "--layers") o.layers = std::stoll(next());
    else if (a == "--hidden") o.hidden = std::stoll(next());
    else if (a == "--heads") o.heads = std::stoll(next());
    else if (a == "--groups") o.groups = std::stoll(next());
    else if (a == "--ffn") o.ffn = std::stoll(next());
    else if (a == "--vocab") o.vocab = std::stoll(next());
    else if (a == "--steps") o.steps = std::stoll(next());
    else if (a == "--cps") {
      o.cps.clear();
      for (const std::string& t : split(next())) o.cps.push_back(std::stoi(t));
    } else if (a == "--types") o.types = split(next());
    else if (a == "--device") o.device = next();
    else if (a == "--bf16") o.bf16 = true;
    else if (a == "--json") o.json = next();
    else MPT_THROW(str("bench_cp: unknown option ", a), "see the header of bench/bench_cp.cpp");
  }
  return o;
}

struct Row {
  int cp = 1;
  std::string type;
  double ms = 0, act_mb = 0, peak_mb = 0, est_mb = 0;
};

// One row on `comm` (the row's cp ranks).
Row run_row(const Options& o, MPI_Comm comm, int cp, const std::string& type) {
  std::vector<std::string> f = {
      "--num-layers", std::to_string(o.layers), "--hidden-size", std::to_string(o.hidden), "--num-attention-heads",
      std::to_string(o.heads), "--group-query-attention", "--num-query-groups", std::to_string(o.groups),
      "--ffn-hidden-size", std::to_string(o.ffn), "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type",
      "rope", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--seq-length", std::to_string(o.seq),
      "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", std::to_string(o.steps), "--lr", "1e-4",
      "--hidden-dropout", "0", "--attention-dropout", "0", "--mock-data", "--log-interval", "1", "--eval-iters", "0",
      "--device", o.device, "--context-parallel-size", std::to_string(cp), "--cp-comm-type",
      type == "-" ? "p2p" : type};
  if (o.bf16) f.push_back("--bf16");
  if (o.device == "cuda") f.push_back("--force-mpi-for-device");  // ranks may share a GPU here
  TrainArgs a;
  a.world_size = cp;
  std::vector<char*> argv{const_cast<char*>("bench_cp")};
  for (auto& s : f) argv.push_back(s.data());
  parse_train_args(static_cast<int>(argv.size()), argv.data(), a);
  a.model.vocab_size = o.vocab;
  a.model.padded_vocab_size = o.vocab;
  const std::shared_ptr<SampleSource> data = make_gpt_data(a, o.vocab);
  ParallelRuntime rt(comm, a);
  const Device dev = rt.device();
  Row r;
  r.cp = cp;
  r.type = type;
  TrainSummary s;
  {
    Trainer t(a, data, rt.context());
    s = t.run();
    // What stays live after the run (weights, gradients, optimizer state) is not activation.
    const double stays = static_cast<double>(memory_stats(dev).current_bytes);
    r.act_mb = (static_cast<double>(s.peak_memory_bytes) - stays) / 1e6;
  }
  r.ms = 1e3 * static_cast<double>(o.seq) / std::max(s.tokens_per_second, 1e-9);
  r.peak_mb = static_cast<double>(s.peak_memory_bytes) / 1e6;
  r.est_mb = static_cast<double>(s.estimated_memory_bytes) / 1e6;
  // The row's numbers: the largest activation peak over its ranks, rank 0's time.
  double mx[3] = {r.act_mb, r.peak_mb, r.est_mb}, out[3];
  MPI_Allreduce(mx, out, 3, MPI_DOUBLE, MPI_MAX, comm);
  r.act_mb = out[0], r.peak_mb = out[1], r.est_mb = out[2];
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int rc = 0;
  try {
    Options o = parse(argc, argv);
    MPT_CHECK(o.device == "cpu" || cuda_available(), "bench_cp --device cuda: no usable GPU", cuda_unavailable_reason());
    std::vector<Row> rows;
    for (int cp : o.cps) {
      if (cp > world) {
        if (rank == 0) std::printf("SKIPPED cp %d: needs %d ranks, the world has %d\n", cp, cp, world);
        continue;
      }
      for (const std::string& type : cp == 1 ? std::vector<std::string>{"-"} : o.types) {
        MPI_Comm comm;
        MPI_Comm_split(MPI_COMM_WORLD, rank < cp ? 0 : MPI_UNDEFINED, rank, &comm);
        Row r;
        if (comm != MPI_COMM_NULL) {
          r = run_row(o, comm, cp, type);
          MPI_Comm_free(&comm);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) rows.push_back(r);
      }
    }
    if (rank == 0) {
      const double base = rows.empty() || rows[0].cp != 1 ? 0 : rows[0].act_mb;
      std::printf("\n# bench_cp: Llama block, %lld layers, hidden %lld, %lld heads in %lld kv groups, ffn %lld, vocab %lld; "
                  "T = %lld, micro-batch 1, %s on %s, %d ranks in the world\n",
                  static_cast<long long>(o.layers), static_cast<long long>(o.hidden), static_cast<long long>(o.heads),
                  static_cast<long long>(o.groups), static_cast<long long>(o.ffn), static_cast<long long>(o.vocab),
                  static_cast<long long>(o.seq), o.bf16 ? "bf16" : "f32", o.device.c_str(), world);
      std::printf("%3s  %-10s  %10s  %10s  %12s  %8s  %10s  %10s\n", "cp", "comm", "ms/step", "tokens/s", "act MB/rank",
                  "vs CP 1", "peak MB", "est MB");
      nlohmann::json j = nlohmann::json::array();
      for (const Row& r : rows) {
        std::printf("%3d  %-10s  %10.1f  %10.0f  %12.1f  %8.3f  %10.1f  %10.1f\n", r.cp, r.type.c_str(), r.ms,
                    1e3 * static_cast<double>(o.seq) / r.ms, r.act_mb, base > 0 ? r.act_mb / base : 0.0, r.peak_mb,
                    r.est_mb);
        j.push_back({{"cp", r.cp}, {"comm", r.type}, {"ms_per_step", r.ms}, {"activation_mb_per_rank", r.act_mb},
                     {"vs_cp1", base > 0 ? r.act_mb / base : 0.0}, {"peak_mb", r.peak_mb}, {"estimate_mb", r.est_mb},
                     {"seq", o.seq}, {"layers", o.layers}, {"hidden", o.hidden}, {"device", o.device},
                     {"dtype", o.bf16 ? "bf16" : "f32"}, {"world", world}});
      }
      if (!o.json.empty()) std::ofstream(o.json) << j.dump(2) << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cp: %s\n", e.what());
    rc = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
