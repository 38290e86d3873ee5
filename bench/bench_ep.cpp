// bench/bench_ep.cpp — the expert-parallel token dispatchers (parallel/expert_parallel.h):
// one MoE layer's trip of the permuted rows to their experts' ranks and back, alltoall and
// allgather side by side, over the world as the ep group.
//
//   mpirun -np 4 --oversubscribe build/bench/bench_ep                      # CPU, f32
//   mpirun -np 8 build/bench/bench_ep --device cuda --dtype bf16 --tokens 8192 --hidden 4096
//
// Each rank routes --tokens N tokens to --topk k of --experts E experts (default 8 per rank):
// uniformly, or with --skew s > 0 from a Zipf(s) law over the experts (a few experts, so a
// few ranks, get most rows: the imbalance dropless routing sees early in training). Rows are
// C = --hidden wide. Timed, each the maximum over ranks of the mean of --iters runs after
// --warmup (a barrier before each timed loop; the device synchronised on CUDA):
//   plan ms   ExpertExchange's construction (the all-gather of every rank's E counts)
//   to ms     to_experts: xp (R, C) → xe (Re, C)
//   from ms   from_experts: ye (Re, C) → yp (R, C) (the backward of to_experts, and vice versa)
//   max Re    the most rows any rank's experts receive (N·k per rank when balanced)
//   MB/rank   bytes a rank sends plus receives in to + from (the largest over ranks):
//             alltoall moves the rows bound for other ranks; allgather all-gathers every
//             rank's rows and reduce-scatters as many back
//   GB/s      MB/rank / (to + from)
// Before timing it checks that from_experts(to_experts(xp)) == xp and that both dispatchers
// give the same xe (exits 1 naming the difference).
// Options: --tokens N --hidden C --experts E --topk k --skew s --dtype f32|bf16
//          --device cpu|cuda|auto --iters I --warmup W --json FILE.
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

#include "core/device.h"
#include "core/error.h"
#include "parallel/expert_parallel.h"

using namespace mpitron;

namespace {

struct Options {
  int64_t tokens = 4096, hidden = 1024, experts = 0, topk = 2;
  double skew = 0;
  std::string dtype, device = "auto", json;
  int iters = 10, warmup = 2;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) MPT_THROW(str("bench_ep: ", a, " needs a value"), "");
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
  return o;
}

// counts (E): this rank's N·k choices spread over the experts (seeded by the rank).
std::vector<int64_t> route(const Options& o, int rank) {
  std::mt19937 rng(1234u + static_cast<uint32_t>(rank));
  std::vector<double> w(static_cast<size_t>(o.experts), 1.0);
  if (o.skew > 0)
    for (int64_t e = 0; e < o.experts; ++e) w[static_cast<size_t>(e)] = 1.0 / std::pow(static_cast<double>(e + 1), o.skew);
  std::discrete_distribution<int64_t> pick(w.begin(), w.end());
  std::vector<int64_t> counts(static_cast<size_t>(o.experts), 0);
  for (int64_t i = 0; i < o.tokens * o.topk; ++i) ++counts[static_cast<size_t>(pick(rng))];
  return counts;
}

double max_over_ranks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

void sync(Device d) {
  if (d.is_cuda()) device_synchronize();
}

// Mean ms of f over o.iters runs after o.warmup, the largest over ranks.
template <class F>
double time_ms(const Options& o, Device d, F&& f) {
  for (int i = 0; i < o.warmup; ++i) f();
  sync(d);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) f();
  sync(d);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / o.iters;
  return max_over_ranks(ms);
}

std::vector<float> host(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).to(DType::F32);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
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
    const bool gpu = o.device == "cuda" || (o.device == "auto" && cuda_available());
    const Device dev = gpu ? Device::cuda(0) : Device::cpu();
    if (o.dtype.empty()) o.dtype = gpu ? "bf16" : "f32";
    const DType dt = o.dtype == "bf16" ? DType::BF16 : DType::F32;
    if (o.experts == 0) o.experts = 8 * world;
    MPT_CHECK(o.experts % world == 0, str("bench_ep: --experts ", o.experts, " is not divisible by the ", world, " ranks"), "");
    CommOptions co;
    co.name = "ep";
    auto comm = make_communicator(MPI_COMM_WORLD, dev, co);
    const std::vector<int64_t> counts = route(o, rank);
    int64_t R = 0;
    for (const int64_t c : counts) R += c;
    std::vector<float> v(static_cast<size_t>(R * o.hidden));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 2654435761u + static_cast<size_t>(rank)) % 1000) / 1000.0f;
    const Tensor xp = Tensor::from_vector(v, {R, o.hidden}).to(dt).to(dev);
    const double elem = dt == DType::BF16 ? 2.0 : 4.0;
    nlohmann::json rows = nlohmann::json::array();
    std::vector<float> first_xe;
    if (rank == 0)
      std::printf("bench_ep: %d ranks, %s %s, N=%lld tokens/rank, C=%lld, E=%lld, top-%lld, skew %.2f\n", world,
                  dev.name().c_str(), o.dtype.c_str(), static_cast<long long>(o.tokens), static_cast<long long>(o.hidden),
                  static_cast<long long>(o.experts), static_cast<long long>(o.topk), o.skew);
    if (rank == 0)
      std::printf("%-10s %9s %9s %9s %9s %9s %8s\n", "dispatcher", "plan ms", "to ms", "from ms", "max Re", "MB/rank", "GB/s");
    for (const MoeDispatcher d : {MoeDispatcher::AllToAll, MoeDispatcher::AllGather}) {
      const ExpertParallel ep{comm.get(), world, rank, d};
      const ExpertExchange x(ep, counts, dev);
      // Check once, untimed.
      const Tensor xe = x.to_experts(xp);
      const bool back_ok = host(x.from_experts(xe)) == host(xp);
      const std::vector<float> got = host(xe);
      const bool same = first_xe.empty() || got == first_xe;
      if (first_xe.empty()) first_xe = got;
      int ok = back_ok && same ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      MPT_CHECK(ok, str("bench_ep: ", moe_dispatcher_name(d), back_ok ? " gives other rows than alltoall" : " does not return xp"),
                "");
      const double plan = time_ms(o, dev, [&] { ExpertExchange(ep, counts, dev); });
      const double to = time_ms(o, dev, [&] { x.to_experts(xp); });
      const double from = time_ms(o, dev, [&] { x.from_experts(xe); });
      // Bytes this rank moves in one to + from.
      double rows_moved = 0;
      if (d == MoeDispatcher::AllToAll) {
        const int64_t E = o.experts, El = E / world;
        int64_t own_sent = 0;
        for (int64_t l = 0; l < El; ++l) own_sent += counts[static_cast<size_t>(rank * El + l)];
        int64_t own_recv = own_sent;  // rows this rank keeps for itself are not moved
        rows_moved = 2.0 * static_cast<double>((R - own_sent) + (x.local_rows() - own_recv));
      } else {
        int64_t all = R;
        MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        rows_moved = 2.0 * static_cast<double>(all - R) + 2.0 * static_cast<double>(R);  // gathered in, scattered back
      }
      const double mb = max_over_ranks(rows_moved * static_cast<double>(o.hidden) * elem / 1e6);
      const double max_re = max_over_ranks(static_cast<double>(x.local_rows()));
      const double gbs = mb / 1e3 / ((to + from) / 1e3);
      if (rank == 0)
        std::printf("%-10s %9.3f %9.3f %9.3f %9.0f %9.2f %8.2f\n", moe_dispatcher_name(d), plan, to, from, max_re, mb, gbs);
      rows.push_back({{"dispatcher", moe_dispatcher_name(d)}, {"plan_ms", plan}, {"to_ms", to}, {"from_ms", from},
                      {"max_local_rows", max_re}, {"mb_per_rank", mb}, {"gb_per_s", gbs}});
    }
    if (rank == 0) std::printf("check: ok (round trip exact, dispatchers agree)\n");
    if (rank == 0 && !o.json.empty()) {
      std::ofstream f(o.json);
      f << nlohmann::json{{"ranks", world}, {"device", dev.name()}, {"dtype", o.dtype}, {"tokens", o.tokens},
                          {"hidden", o.hidden}, {"experts", o.experts}, {"topk", o.topk}, {"skew", o.skew}, {"rows", rows}}
                .dump(2)
        << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s\n", rank, e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
