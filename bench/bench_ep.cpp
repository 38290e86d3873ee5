// bench/bench_ep.cpp — the expert-parallel token dispatchers (parallel/expert_parallel.h):
// one MoE layer's trip of the permuted rows to their experts' ranks and back, alltoall and
// allgather side by side, over the world as the ep group.
//
//   mpirun -np 4 --oversubscribe build/bench/bench_ep                      # CPU, f32
//   mpirun -np 8 build/bench/bench_ep --device cuda --dtype bf16 --tokens 8192 --hidden 4096
//
// Options: --tokens N (per rank, 4096) --hidden C (1024) --experts E (8 per rank; a multiple of
// the ranks) --topk k (2) --skew s (0) --dtype f32|bf16 (bf16 on CUDA, f32 on the CPU)
// --device cpu|cuda|auto (auto: cuda when every rank has a GPU) --iters I (10) --warmup W (2)
// --json FILE.
//
// Routing: each rank makes N·k choices of an expert, uniformly, or with --skew s > 0 from a
// Zipf(s) law over the experts (P(e) ∝ 1 / (e + 1)^s: the first experts, so the first ranks,
// get most rows — the imbalance dropless routing sees early in training). std::mt19937 seeded
// by the rank, so a run repeats. counts (E) are the rows per expert; xp (R = Σ counts, C)
// holds deterministic values grouped by expert, as tensor/moe_permute.h leaves them.
//
// Columns, one row per dispatcher. Times are the maximum over ranks of the mean of --iters
// runs after --warmup (a barrier before each timed loop; the device synchronised on CUDA):
//   plan ms   ExpertExchange's construction (the all-gather of every rank's E counts, the plan)
//   to ms     to_experts: xp (R, C) → xe (Re, C)
//   from ms   from_experts: ye (Re, C) → yp (R, C), with ye = xe (the adjoint of to_experts)
//   max Re    the most rows any rank's experts receive (N·k when balanced)
//   MB/rank   bytes a rank sends plus receives in one to + from, its own rows not counted,
//             the largest over ranks (1e6 bytes; P ranks, own = rows it routes to its own
//             experts, all = Σ R over ranks):
//               alltoall   2 · ((R − own) + (Re − own)) rows
//               allgather  2 · ((all − R) + (P − 1) · R) rows: the all-gather receives every
//                          other rank's rows and sends its R to each peer; the reduce-scatter
//                          back sends the peers' slots and receives P − 1 partials of its own.
//             Uniform routing makes allgather P × alltoall, as the header says.
//   GB/s      MB/rank / (to ms + from ms), 1e9 bytes per second
// Check (untimed, before timing): from_experts(to_experts(xp)) == xp bit for bit, and both
// dispatchers give the same xe on every rank (compared on the host). Prints "check: ok", or
// names the failure and exits 1.
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"                  // cuda_available, cuda_set_device, device_synchronize
#include "core/error.h"                   // MPT_CHECK, str
#include "parallel/communicator.h"        // make_communicator
#include "parallel/expert_parallel.h"     // ExpertParallel, ExpertExchange

using namespace mpitron;

namespace {

struct Options {
  int64_t tokens = 4096, hidden = 1024, experts = 0, topk = 2;  // experts 0: 8 per rank
  double skew = 0;
  std::string dtype, device = "auto", json;                     // dtype "": by device
  int iters = 10, warmup = 2;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      MPT_CHECK(i + 1 < argc, str("bench_ep: ", a, " needs a value"), "see the header of bench/bench_ep.cpp");
      return argv[++i];
    };
    if (a == "--tokens") o.tokens = std::stoll(next());
    else if (a == "--hidden") o.hidden = std::stoll(next());
    else if (a == "--experts") o.experts = std::stoll(next());
    else if (a == "--topk") o.topk = std::stoll(next());
    else if (a == "--skew") o.skew = std::stod(next());
    else if (a == "--dtype") o.dtype = next();
    else if (a == "--device") o.device = next();
    else if (a == "--iters") o.iters = std::stoi(next());
    else if (a == "--warmup") o.warmup = std::stoi(next());
    else if (a == "--json") o.json = next();
    else MPT_THROW(str("bench_ep: unknown option ", a), "see the header of bench/bench_ep.cpp");
  }
  MPT_CHECK(o.dtype.empty() || o.dtype == "f32" || o.dtype == "bf16", str("bench_ep: --dtype ", o.dtype, " unknown"),
            "use f32 or bf16");
  MPT_CHECK(o.device == "cpu" || o.device == "cuda" || o.device == "auto", str("bench_ep: --device ", o.device, " unknown"),
            "use cpu, cuda or auto");
  MPT_CHECK(o.tokens >= 1 && o.hidden >= 1 && o.topk >= 1 && o.experts >= 0 && o.skew >= 0,
            "bench_ep: --tokens, --hidden, --topk must be >= 1, --experts and --skew >= 0", "");
  MPT_CHECK(o.iters >= 1 && o.warmup >= 0, "bench_ep: --iters must be >= 1 and --warmup >= 0", "");
  return o;
}

bool all_ranks(bool v) {
  int x = v ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return x == 1;
}

double max_over_ranks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

// cuda (the node-local rank's GPU) when asked, or for auto when every rank has one; else cpu.
Device pick_device(const Options& o) {
  const bool gpu_everywhere = all_ranks(cuda_available());
  MPT_CHECK(o.device != "cuda" || gpu_everywhere, "bench_ep --device cuda: a rank has no usable GPU",
            cuda_available() ? "" : cuda_unavailable_reason());
  if (o.device == "cpu" || !gpu_everywhere) return Device::cpu();
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  const int index = local % cuda_device_count();
  cuda_set_device(index);
  return Device::cuda(index);
}

// counts (E): how many of this rank's N·k choices go to each expert.
std::vector<int64_t> route(const Options& o, int rank) {
  std::mt19937 rng(1234u + static_cast<uint32_t>(rank));
  std::vector<double> weight(static_cast<size_t>(o.experts), 1.0);
  if (o.skew > 0)
    for (size_t e = 0; e < weight.size(); ++e) weight[e] = 1.0 / std::pow(static_cast<double>(e + 1), o.skew);
  std::discrete_distribution<int64_t> pick(weight.begin(), weight.end());
  std::vector<int64_t> counts(weight.size(), 0);
  for (int64_t i = 0; i < o.tokens * o.topk; ++i) ++counts[static_cast<size_t>(pick(rng))];
  return counts;
}

// xp (R, C): values k/1000 (rounded once to the dtype, then only moved), different on every rank.
Tensor make_rows(int64_t R, int64_t C, int rank, DType dt, Device dev) {
  std::vector<float> v(static_cast<size_t>(R * C));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>((i * 2654435761u + static_cast<size_t>(rank) * 7919u) % 1000) / 1000.0f;
  return Tensor::from_vector(v, {R, C}).to(dt).to(dev);
}

std::vector<float> host(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).to(DType::F32);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

// Mean ms of f over o.iters runs after o.warmup, the largest over ranks.
template <class F>
double time_ms(const Options& o, Device dev, F&& f) {
  for (int i = 0; i < o.warmup; ++i) f();
  if (dev.is_cuda()) device_synchronize();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) f();
  if (dev.is_cuda()) device_synchronize();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / o.iters;
  return max_over_ranks(ms);
}

// Rows this rank sends plus receives in one to + from (see the header), own rows excluded.
double moved_rows(MoeDispatcher d, const std::vector<int64_t>& counts, const ExpertExchange& x, int world, int rank) {
  const int64_t R = x.rows(), El = static_cast<int64_t>(counts.size()) / world;
  if (d == MoeDispatcher::AllToAll) {
    int64_t own = 0;  // rows routed to this rank's own experts: copied, not sent
    for (int64_t l = 0; l < El; ++l) own += counts[static_cast<size_t>(rank * El + l)];
    return 2.0 * static_cast<double>((R - own) + (x.local_rows() - own));
  }
  int64_t all = R;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return 2.0 * static_cast<double>((all - R) + (world - 1) * R);
}

struct Row {
  std::string dispatcher;
  double plan_ms = 0, to_ms = 0, from_ms = 0, max_local_rows = 0, mb_per_rank = 0, gb_per_s = 0;
};

// One dispatcher: check (xe kept in *first_xe for the next dispatcher to match), then time.
Row run(const Options& o, MoeDispatcher d, Communicator* comm, int world, int rank, const std::vector<int64_t>& counts,
        const Tensor& xp, Device dev, std::vector<float>* first_xe) {
  const ExpertParallel ep{comm, world, rank, d};
  const ExpertExchange x(ep, counts, dev);
  const Tensor xe = x.to_experts(xp);
  const bool round_trip = all_ranks(host(x.from_experts(xe)) == host(xp));
  const std::vector<float> got = host(xe);
  const bool same = all_ranks(first_xe->empty() || got == *first_xe);
  MPT_CHECK(round_trip, str("bench_ep: ", moe_dispatcher_name(d), ": from_experts(to_experts(xp)) != xp"), "");
  MPT_CHECK(same, str("bench_ep: ", moe_dispatcher_name(d), " gives other xe rows than alltoall"), "");
  if (first_xe->empty()) *first_xe = got;

  Row r;
  r.dispatcher = moe_dispatcher_name(d);
  r.plan_ms = time_ms(o, dev, [&] { ExpertExchange(ep, counts, dev); });
  r.to_ms = time_ms(o, dev, [&] { x.to_experts(xp); });
  r.from_ms = time_ms(o, dev, [&] { x.from_experts(xe); });
  const double elem = xp.dtype() == DType::BF16 ? 2.0 : 4.0;
  r.max_local_rows = max_over_ranks(static_cast<double>(x.local_rows()));
  r.mb_per_rank = max_over_ranks(moved_rows(d, counts, x, world, rank) * static_cast<double>(o.hidden) * elem / 1e6);
  r.gb_per_s = r.mb_per_rank / (r.to_ms + r.from_ms);  // MB/ms = GB/s
  return r;
}

void save_json(const Options& o, int world, Device dev, const std::vector<Row>& rows) {
  nlohmann::json j{{"ranks", world}, {"device", dev.name()}, {"dtype", o.dtype}, {"tokens", o.tokens},
                   {"hidden", o.hidden}, {"experts", o.experts}, {"topk", o.topk}, {"skew", o.skew},
                   {"iters", o.iters}, {"warmup", o.warmup}, {"check", "ok"}, {"rows", nlohmann::json::array()}};
  for (const Row& r : rows)
    j["rows"].push_back({{"dispatcher", r.dispatcher}, {"plan_ms", r.plan_ms}, {"to_ms", r.to_ms}, {"from_ms", r.from_ms},
                         {"max_local_rows", r.max_local_rows}, {"mb_per_rank", r.mb_per_rank}, {"gb_per_s", r.gb_per_s}});
  std::ofstream f(o.json);
  MPT_CHECK(f.good(), str("bench_ep: cannot write ", o.json), "");
  f << j.dump(2) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int rc = 0;
  try {
    Options o = parse(argc, argv);
    MPT_CHECK(world >= 2, "bench_ep: needs at least 2 ranks (the world is the ep group)", "mpirun -np 2 or more");
    const Device dev = pick_device(o);
    if (o.dtype.empty()) o.dtype = dev.is_cuda() ? "bf16" : "f32";
    if (o.experts == 0) o.experts = 8 * world;
    MPT_CHECK(o.experts % world == 0, str("bench_ep: --experts ", o.experts, " is not divisible by the ", world, " ranks"), "");
    CommOptions co;
    co.name = "ep";
    auto comm = make_communicator(MPI_COMM_WORLD, dev, co);

    const std::vector<int64_t> counts = route(o, rank);  // (E)
    int64_t R = 0;
    for (const int64_t c : counts) R += c;
    const Tensor xp = make_rows(R, o.hidden, rank, o.dtype == "bf16" ? DType::BF16 : DType::F32, dev);  // (R, C)

    if (rank == 0) {
      std::printf("bench_ep: %d ranks, %s %s, N=%lld tokens/rank, C=%lld, E=%lld, top-%lld, skew %.2f, iters %d\n", world,
                  dev.name().c_str(), o.dtype.c_str(), static_cast<long long>(o.tokens), static_cast<long long>(o.hidden),
                  static_cast<long long>(o.experts), static_cast<long long>(o.topk), o.skew, o.iters);
      std::printf("%-10s %9s %9s %9s %9s %9s %8s\n", "dispatcher", "plan ms", "to ms", "from ms", "max Re", "MB/rank", "GB/s");
    }
    std::vector<Row> rows;
    std::vector<float> first_xe;  // alltoall's xe, for allgather to match
    for (const MoeDispatcher d : {MoeDispatcher::AllToAll, MoeDispatcher::AllGather}) {
      const Row r = run(o, d, comm.get(), world, rank, counts, xp, dev, &first_xe);
      if (rank == 0)
        std::printf("%-10s %9.3f %9.3f %9.3f %9.0f %9.2f %8.2f\n", r.dispatcher.c_str(), r.plan_ms, r.to_ms, r.from_ms,
                    r.max_local_rows, r.mb_per_rank, r.gb_per_s);
      rows.push_back(r);
    }
    if (rank == 0) std::printf("check: ok (round trip exact, dispatchers agree)\n");
    if (rank == 0 && !o.json.empty()) save_json(o, world, dev, rows);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s\n", rank, e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
