// bench/bench_comm.cpp — bus bandwidth of the Communicator: all-reduce,
// reduce-scatter, all-gather and send/recv, over message sizes, MPI and NCCL.
//
//   mpirun -np N bench_comm [--min-bytes 1K] [--max-bytes 64M] [--iters 20] [--warmup 5]
//                           [--dtype f32|bf16] [--backend mpi|nccl|both] [--device cpu|cuda|auto]
//                           [--ops all_reduce,reduce_scatter,all_gather,sendrecv] [--no-check] [--json FILE]
//   mpirun -np 4 bench_comm --dp-step PRESET [--dp-batch B] [--dp-seq T] [--dp-steps N] [--dp-bucket ELEMS]
//                           [--dtype f32|bf16] [--device cpu|cuda|auto]
//
// --dp-step: instead of the collectives, the data-parallel training step of a GPT
// of that preset (bench/train_step_bench.h: tiny, 124M, …) with and without
// overlap, at dp 2 and 4 (those that fit the world) — bench/dp_step_bench.h.
//
// Sizes double from --min-bytes to --max-bytes (K, M, G suffixes are powers of
// 1024). --max-bytes defaults to 64M on the CPU and 1G on CUDA. --device auto
// (the default) is cuda when every rank has a usable GPU, else cpu.
//
// Conventions are those of nccl-tests, so the numbers compare with theirs:
//   size   the full data size in bytes: the all-reduce buffer, reduce-scatter's
//          input (n chunks), all-gather's output (n chunks), the message each rank
//          sends (and receives) for send/recv. count = size / element size.
//   time   each rank runs `warmup` untimed operations, a barrier, then `iters`
//          timed ones back to back; time = the maximum over ranks of the average
//          per-iteration time.
//   algbw  = size / time
//   busbw  = algbw · 2(n−1)/n  for all-reduce,
//          = algbw · (n−1)/n   for reduce-scatter and all-gather,
//          = algbw · 1         for send/recv,
//          i.e. the bytes each rank's link carries under an optimal (ring)
//          algorithm per second, comparable across n and with a link's peak.
//          n = 1: the collectives' factor is 0 (nothing crosses a link), busbw
//          prints 0 and algbw only times local work (a copy, or nothing for
//          the in-place all-reduce).
//   GB/s   1e9 bytes per second.
//
// send/recv ("sendrecv"): ranks 2k and 2k+1 exchange `size` bytes (each sends
// and receives); with an odd n the last rank idles; skipped with n = 1. Both
// directions are posted as one batch (Communicator::batch_p2p_async: one NCCL
// group, or MPI Isend + Irecv), so the row is the full-duplex exchange a
// pipeline's send_forward_recv_backward gets.
//
// Issue pattern: on MPI each iteration waits for its operation (nonblocking MPI
// operations on a buffer still in flight are erroneous); on NCCL all iterations
// are enqueued back to back on the communicator's stream and waited at the end,
// as nccl-tests does. The MPI backend on --device cuda stages through host
// memory (CommOptions::force_mpi_for_device). NCCL needs a CUDA build,
// --device cuda, a usable GPU on every rank and no more ranks per node than
// GPUs; otherwise it is skipped and the reason printed.
//
// Check: before timing each (op, size) one operation runs on rank-dependent
// values and the first and last element of every chunk are compared with the
// expected ones (--no-check skips this); a mismatch marks the row FAIL and
// the exit code 1. All-reduce buffers are then zeroed so that the repeated
// in-place sums stay finite.
#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/grid.h"
#include "tensor/tensor.h"
#include "bench/dp_step_bench.h"  // --dp-step

using namespace mpitron;

namespace {

enum class Op { AllReduce, ReduceScatter, AllGather, SendRecv };
const Op kAllOps[] = {Op::AllReduce, Op::ReduceScatter, Op::AllGather, Op::SendRecv};

const char* op_name(Op op) {
  switch (op) {
    case Op::AllReduce: return "all_reduce";
    case Op::ReduceScatter: return "reduce_scatter";
    case Op::AllGather: return "all_gather";
    case Op::SendRecv: return "sendrecv";
  }
  return "?";
}

// nccl-tests' bus bandwidth factor for n ranks.
double bus_factor(Op op, int n) {
  switch (op) {
    case Op::AllReduce: return 2.0 * (n - 1) / n;
    case Op::ReduceScatter:
    case Op::AllGather: return double(n - 1) / n;
    case Op::SendRecv: return 1.0;
  }
  return 0;
}

const char* bus_formula(Op op) {
  switch (op) {
    case Op::AllReduce: return "busbw = algbw * 2(n-1)/n";
    case Op::ReduceScatter:
    case Op::AllGather: return "busbw = algbw * (n-1)/n";
    case Op::SendRecv: return "busbw = algbw (pairs 2k <-> 2k+1)";
  }
  return "";
}

const char* kOneRankNote =
    "n = 1: the collectives' bus factor 2(n-1)/n or (n-1)/n is 0, so busbw is 0; algbw is local work only "
    "(a copy for reduce_scatter/all_gather, nothing for the in-place all_reduce); sendrecv needs 2 ranks";

struct Options {
  int64_t min_bytes = int64_t(1) << 10;
  int64_t max_bytes = 0;  // 0: 64 MiB on the CPU, 1 GiB on CUDA
  int iters = 20, warmup = 5;
  DType dtype = DType::F32;
  std::string backend = "both", device = "auto", json;
  std::vector<Op> ops{std::begin(kAllOps), std::end(kAllOps)};
  bool check = true;
  std::string dp_step;  // --dp-step PRESET: the data-parallel step with and without overlap instead
  bench::DpStepOptions dp;
};

// "4096", "1K", "64M", "1G", "64MiB", "64MB" (K/M/G are powers of 1024).
int64_t parse_bytes(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    MPT_THROW(str("bench_comm: '", s, "' is not a size"), "give bytes, optionally with K, M or G (e.g. 64M)");
  }
  std::string unit = s.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit == "IB" || unit == "B") unit.clear();
  if (unit.size() > 1 && (unit.substr(1) == "IB" || unit.substr(1) == "B")) unit = unit.substr(0, 1);
  double mult = 1;
  if (unit == "K") mult = 1024.0;
  else if (unit == "M") mult = 1024.0 * 1024;
  else if (unit == "G") mult = 1024.0 * 1024 * 1024;
  else MPT_CHECK(unit.empty(), str("bench_comm: unknown unit in size '", s, "'"), "use K, M or G (powers of 1024)");
  const double b = v * mult;
  MPT_CHECK(b >= 1 && b < 1e15, str("bench_comm: size '", s, "' out of range"), "");
  return static_cast<int64_t>(b);
}

std::string human_bytes(int64_t b) {
  char buf[32];
  if (b >= (int64_t(1) << 30) && b % (int64_t(1) << 30) == 0) std::snprintf(buf, sizeof buf, "%lld GiB", (long long)(b >> 30));
  else if (b >= (int64_t(1) << 20) && b % (int64_t(1) << 20) == 0) std::snprintf(buf, sizeof buf, "%lld MiB", (long long)(b >> 20));
  else if (b >= 1024 && b % 1024 == 0) std::snprintf(buf, sizeof buf, "%lld KiB", (long long)(b >> 10));
  else std::snprintf(buf, sizeof buf, "%lld B", (long long)b);
  return buf;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Every rank passes its own (ok, reason); returns true when all are ok, else
// false with the reason of the lowest failing rank (on every rank).
bool all_ok(bool ok, const std::string& reason, std::string& first_reason) {
  const int rank = [] {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }();
  int mine = ok ? INT_MAX : rank, lowest = INT_MAX;
  MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (lowest == INT_MAX) return true;
  std::string msg = rank == lowest ? str(reason, " (world rank ", rank, ")") : std::string();
  int len = static_cast<int>(msg.size());
  MPI_Bcast(&len, 1, MPI_INT, lowest, MPI_COMM_WORLD);
  msg.resize(static_cast<size_t>(len));
  MPI_Bcast(msg.data(), len, MPI_CHAR, lowest, MPI_COMM_WORLD);
  first_reason = msg;
  return false;
}

struct Row {
  std::string backend, op;
  int64_t bytes = 0, count = 0;
  double time_us = 0, algbw = 0, busbw = 0;
  std::string check;  // "ok", "FAIL", "-" (not checked)
};

class Bench {
 public:
  Bench(const Options& o, Device dev) : opt_(o), dev_(dev) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &n_);
  }

  // One backend over all ops and sizes.
  void run_backend(const std::string& backend) {
    MPI_Comm dup = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    CommOptions co;
    co.name = "bench";
    co.force_mpi_for_device = backend == "mpi" && dev_.is_cuda();
    {
      std::unique_ptr<Communicator> comm =
          backend == "nccl" ? make_nccl_communicator(dup, co) : make_mpi_communicator(dup, co);
      const bool batched = backend == "nccl";
      for (Op op : opt_.ops) {
        if (op == Op::SendRecv && n_ < 2) {
          if (rank_ == 0) std::printf("\n# %s %s: skipped, needs at least 2 ranks\n", backend.c_str(), op_name(op));
          continue;
        }
        if (rank_ == 0) {
          std::printf("\n# %s  backend %s%s  device %s  dtype %s  ranks %d  (%s)\n", op_name(op), backend.c_str(),
                      co.force_mpi_for_device ? " (host-staged)" : "", dev_.is_cuda() ? "cuda" : "cpu",
                      dtype_name(opt_.dtype), n_, bus_formula(op));
          std::printf("%14s %12s %12s %12s %12s  %s\n", "size(B)", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
                      "check");
          std::fflush(stdout);
        }
        for (int64_t b = opt_.min_bytes; b <= opt_.max_bytes; b *= 2) {
          Row r = measure(*comm, backend, op, b, batched);
          rows_.push_back(r);
          if (rank_ == 0) {
            std::printf("%14lld %12lld %12.2f %12.3f %12.3f  %s\n", (long long)r.bytes, (long long)r.count, r.time_us,
                        r.algbw, r.busbw, r.check.c_str());
            std::fflush(stdout);
          }
        }
      }
    }
    MPI_Comm_free(&dup);
  }

  void skip(const std::string& backend, const std::string& why) {
    skipped_.push_back({backend, why});
    if (rank_ == 0) std::printf("\nSKIPPED %s: %s\n", backend.c_str(), why.c_str());
  }

  bool failed() const {
    return std::any_of(rows_.begin(), rows_.end(), [](const Row& r) { return r.check == "FAIL"; });
  }

  void summary(int nodes) const {
    if (rank_ != 0) return;
    std::printf("\n# summary: peak busbw (GB/s) per backend and op, %d rank(s) on %d node(s)\n", n_, nodes);
    for (const std::string backend : {"mpi", "nccl"})
      for (Op op : opt_.ops) {
        // n = 1: busbw is 0 everywhere, rank by algbw instead.
        auto key = [&](const Row& r) { return n_ == 1 ? r.algbw : r.busbw; };
        const Row* best = nullptr;
        for (const Row& r : rows_)
          if (r.backend == backend && r.op == op_name(op) && (!best || key(r) > key(*best))) best = &r;
        if (best)
          std::printf("  %-5s %-15s busbw %9.3f  algbw %9.3f  at %s\n", backend.c_str(), op_name(op), best->busbw,
                      best->algbw, human_bytes(best->bytes).c_str());
      }
    if (n_ == 1) std::printf("  %s\n", kOneRankNote);
    if (failed()) std::printf("  CHECK FAILED on some rows (see 'check' column)\n");
  }

  void save_json(const std::string& file, int nodes) const {
    if (rank_ != 0 || file.empty()) return;
    nlohmann::json j;
    j["ranks"] = n_;
    j["nodes"] = nodes;
    j["device"] = dev_.is_cuda() ? "cuda" : "cpu";
    j["dtype"] = dtype_name(opt_.dtype);
    j["iters"] = opt_.iters;
    j["warmup"] = opt_.warmup;
    j["conventions"] =
        "nccl-tests: time = max over ranks of the mean per-iteration time; algbw = size/time; busbw = algbw * "
        "2(n-1)/n (all_reduce), (n-1)/n (reduce_scatter, all_gather; size = full buffer), 1 (sendrecv); GB/s = 1e9 B/s";
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows_)
      j["rows"].push_back({{"backend", r.backend}, {"op", r.op}, {"bytes", r.bytes}, {"count", r.count},
                           {"time_us", r.time_us}, {"algbw_gbps", r.algbw}, {"busbw_gbps", r.busbw},
                           {"check", r.check}});
    j["skipped"] = nlohmann::json::array();
    for (const auto& [b, why] : skipped_) j["skipped"].push_back({{"backend", b}, {"reason", why}});
    std::ofstream(file) << j.dump(2) << "\n";
    std::printf("\nwrote %s\n", file.c_str());
  }

 private:
  struct Buffers {
    Tensor a, b;          // all_reduce: a; reduce_scatter/all_gather: in a, out b; sendrecv: send a, recv b
    int64_t chunk = 0;    // elements per rank chunk (reduce_scatter, all_gather)
    int64_t count = 0;    // elements of the full size
    int peer = -1;        // sendrecv partner (-1: idle)
  };

  Buffers make_buffers(Op op, int64_t bytes) const {
    const int64_t es = static_cast<int64_t>(dtype_size(opt_.dtype));
    Buffers B;
    switch (op) {
      case Op::AllReduce:
        B.count = std::max<int64_t>(1, bytes / es);
        B.a = Tensor::zeros({B.count}, opt_.dtype, dev_);
        break;
      case Op::ReduceScatter:
      case Op::AllGather:
        B.chunk = std::max<int64_t>(1, bytes / es / n_);
        B.count = B.chunk * n_;
        B.a = Tensor::zeros({op == Op::ReduceScatter ? B.count : B.chunk}, opt_.dtype, dev_);
        B.b = Tensor::zeros({op == Op::ReduceScatter ? B.chunk : B.count}, opt_.dtype, dev_);
        break;
      case Op::SendRecv:
        B.count = std::max<int64_t>(1, bytes / es);
        B.peer = (rank_ ^ 1) < n_ ? (rank_ ^ 1) : -1;
        B.a = Tensor::zeros({B.count}, opt_.dtype, dev_);
        B.b = Tensor::zeros({B.count}, opt_.dtype, dev_);
        break;
    }
    return B;
  }

  // Enqueue one operation; its Work handles go to `out`.
  void issue(Communicator& c, Op op, const Buffers& B, std::vector<WorkPtr>& out) const {
    switch (op) {
      case Op::AllReduce: out.push_back(c.all_reduce_async(B.a)); break;
      case Op::ReduceScatter: out.push_back(c.reduce_scatter_async(B.a, B.b)); break;
      case Op::AllGather: out.push_back(c.all_gather_async(B.a, B.b)); break;
      case Op::SendRecv:
        if (B.peer < 0) break;
        out.push_back(c.batch_p2p_async({{true, B.a, B.peer, 0}, {false, B.b, B.peer, 0}}));
        break;
    }
  }

  // Mean seconds per iteration on this rank.
  double timed(Communicator& c, Op op, const Buffers& B, int reps, bool batched) const {
    device_synchronize();
    MPI_Barrier(MPI_COMM_WORLD);
    std::vector<WorkPtr> works;
    const double t0 = now_s();
    if (batched) {
      works.reserve(static_cast<size_t>(reps) * 2);
      for (int i = 0; i < reps; ++i) issue(c, op, B, works);
      for (auto& w : works) w->wait();
    } else {
      for (int i = 0; i < reps; ++i) {
        works.clear();
        issue(c, op, B, works);
        for (auto& w : works) w->wait();
      }
    }
    return (now_s() - t0) / std::max(reps, 1);
  }

  // One op on rank-dependent values; compares the first and last element of
  // every chunk with the expected values. Returns this rank's verdict.
  bool check(Communicator& c, Op op, const Buffers& B) const {
    const double n = n_, tri = n * (n + 1) / 2;  // Σ_r (r+1)
    std::vector<std::pair<int64_t, double>> expect;  // (index in the result tensor, value)
    Tensor result;
    switch (op) {
      case Op::AllReduce:
        B.a.fill(rank_ + 1);
        result = B.a;
        expect = {{0, tri}, {B.count / 2, tri}, {B.count - 1, tri}};
        break;
      case Op::ReduceScatter:
        for (int j = 0; j < n_; ++j) B.a.flat_range(j * B.chunk, B.chunk).fill(double(rank_ + 1) * (j + 1));
        result = B.b;
        expect = {{0, tri * (rank_ + 1)}, {B.chunk - 1, tri * (rank_ + 1)}};
        break;
      case Op::AllGather:
        B.a.fill(rank_ + 1);
        result = B.b;
        for (int j = 0; j < n_; ++j) {
          expect.push_back({j * B.chunk, j + 1.0});
          expect.push_back({(j + 1) * B.chunk - 1, j + 1.0});
        }
        break;
      case Op::SendRecv:
        if (B.peer < 0) return true;
        B.a.fill(rank_ + 1);
        B.b.zero();
        result = B.b;
        expect = {{0, B.peer + 1.0}, {B.count - 1, B.peer + 1.0}};
        break;
    }
    std::vector<WorkPtr> works;
    issue(c, op, B, works);
    for (auto& w : works) w->wait();
    device_synchronize();
    const double rel = opt_.dtype == DType::F32 ? 1e-6 : 3e-2;  // bf16: 8 significant bits, rounded per step
    bool ok = true;
    for (const auto& [i, want] : expect) {
      const double got = result.flat_range(i, 1).item();
      if (!(std::fabs(got - want) <= rel * std::fabs(want))) {
        if (ok)
          std::fprintf(stderr, "bench_comm: rank %d %s %s: element %lld is %g, expected %g\n", rank_, c.backend(),
                       op_name(op), (long long)i, got, want);
        ok = false;
      }
    }
    if (op == Op::AllReduce) B.a.zero();  // the timed in-place sums start from 0 and stay 0
    return ok;
  }

  Row measure(Communicator& c, const std::string& backend, Op op, int64_t bytes, bool batched) const {
    const Buffers B = make_buffers(op, bytes);
    Row r;
    r.backend = backend;
    r.op = op_name(op);
    r.count = B.count;
    r.bytes = B.count * static_cast<int64_t>(dtype_size(opt_.dtype));
    r.check = "-";
    if (opt_.check) {
      int mine = check(c, op, B) ? 1 : 0, all = 0;
      MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      r.check = all ? "ok" : "FAIL";
    }
    if (opt_.warmup > 0) timed(c, op, B, opt_.warmup, batched);
    double t = timed(c, op, B, opt_.iters, batched), tmax = 0;
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    r.time_us = tmax * 1e6;
    r.algbw = double(r.bytes) / tmax / 1e9;
    r.busbw = r.algbw * bus_factor(op, n_);
    return r;
  }

  Options opt_;
  Device dev_;
  int rank_ = 0, n_ = 1;
  std::vector<Row> rows_;
  std::vector<std::pair<std::string, std::string>> skipped_;
};

const char* kUsage =
    "usage: mpirun -np N bench_comm [--min-bytes 1K] [--max-bytes 64M|1G] [--iters 20] [--warmup 5]\n"
    "                               [--dtype f32|bf16] [--backend mpi|nccl|both] [--device cpu|cuda|auto]\n"
    "                               [--ops all_reduce,reduce_scatter,all_gather,sendrecv] [--no-check] [--json FILE]\n"
    "       mpirun -np 4 bench_comm --dp-step PRESET [--dp-batch B] [--dp-seq T] [--dp-steps N] [--dp-bucket ELEMS]\n"
    "                               [--dtype f32|bf16] [--device cpu|cuda|auto]\n";

// Parses argv; returns -1 to go on, else the exit code.
int parse(int argc, char** argv, Options& o, bool print) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      MPT_CHECK(i + 1 < argc, str("bench_comm: ", a, " needs a value"), "run bench_comm --help");
      return argv[++i];
    };
    if (a == "--min-bytes") o.min_bytes = parse_bytes(next());
    else if (a == "--max-bytes") o.max_bytes = parse_bytes(next());
    else if (a == "--iters") o.iters = std::stoi(next());
    else if (a == "--warmup") o.warmup = std::stoi(next());
    else if (a == "--dtype") {
      const std::string d = next();
      MPT_CHECK(d == "f32" || d == "bf16", str("bench_comm: --dtype ", d, " unknown"), "use f32 or bf16");
      o.dtype = d == "f32" ? DType::F32 : DType::BF16;
    } else if (a == "--backend") {
      o.backend = next();
      MPT_CHECK(o.backend == "mpi" || o.backend == "nccl" || o.backend == "both",
                str("bench_comm: --backend ", o.backend, " unknown"), "use mpi, nccl or both");
    } else if (a == "--device") {
      o.device = next();
      MPT_CHECK(o.device == "cpu" || o.device == "cuda" || o.device == "auto",
                str("bench_comm: --device ", o.device, " unknown"), "use cpu, cuda or auto");
    } else if (a == "--ops") {
      o.ops.clear();
      std::stringstream ss(next());
      std::string name;
      while (std::getline(ss, name, ',')) {
        bool found = false;
        for (Op op : kAllOps)
          if (name == op_name(op)) o.ops.push_back(op), found = true;
        MPT_CHECK(found, str("bench_comm: --ops: unknown op '", name, "'"),
                  "use all_reduce, reduce_scatter, all_gather, sendrecv (comma separated)");
      }
    } else if (a == "--dp-step") o.dp_step = next();
    else if (a == "--dp-batch") o.dp.batch = std::stoll(next());
    else if (a == "--dp-seq") o.dp.seq = std::stoll(next());
    else if (a == "--dp-steps") o.dp.steps = std::stoi(next());
    else if (a == "--dp-bucket") o.dp.bucket = std::stoll(next());
    else if (a == "--no-check") o.check = false;
    else if (a == "--json") o.json = next();
    else {
      if (print) std::fprintf(a == "--help" || a == "-h" ? stdout : stderr, "%s", kUsage);
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  MPT_CHECK(o.iters >= 1 && o.warmup >= 0, "bench_comm: --iters must be >= 1 and --warmup >= 0", "");
  MPT_CHECK(o.dp.batch >= 1 && o.dp.seq >= 1 && o.dp.steps >= 1 && o.dp.bucket >= 0,
            "bench_comm: --dp-batch, --dp-seq and --dp-steps must be >= 1, --dp-bucket >= 0", "");
  if (!o.dp_step.empty()) bench::find_preset(o.dp_step);  // an unknown preset is refused on every rank now
  o.dp.preset = o.dp_step;
  o.dp.dtype = o.dtype;
  return -1;
}

// Everything MPI-owned (grid, communicators) lives in here, so it is freed before MPI_Finalize.
int run(int argc, char** argv, int rank, int world) {
  Options opt;
  int prc = -1;
  try {
    prc = parse(argc, argv, opt, rank == 0);
  } catch (const std::exception& e) {  // every rank parses the same argv: no rank is left waiting
    if (rank == 0) std::fprintf(stderr, "%s\n%s", e.what(), kUsage);
    prc = 2;
  }
  if (prc >= 0) return prc;

  // The grid binds each rank to its node-local GPU (local rank % GPUs), as pretrain_gpt does.
  Grid grid(MPI_COMM_WORLD, GridConfig{1, 1, true});
  int is_first = grid.local_rank() == 0, nodes = 0;
  MPI_Allreduce(&is_first, &nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);

  std::string why_no_gpu;
  const bool gpu_everywhere = all_ok(cuda_available(), cuda_available() ? "" : cuda_unavailable_reason(), why_no_gpu);
  const bool use_cuda = opt.device == "cuda" || (opt.device == "auto" && gpu_everywhere);
  if (use_cuda && !gpu_everywhere) {
    if (rank == 0) std::printf("SKIPPED cuda: %s\n", why_no_gpu.c_str());
    return 0;
  }
  const Device dev = use_cuda ? Device::cuda(std::max(grid.device_index(), 0)) : Device::cpu();
  if (!opt.dp_step.empty()) {
    if (world < 2) {
      if (rank == 0) std::printf("SKIPPED --dp-step: needs 2 or more ranks (mpirun -np 4 for dp 2 and 4)\n");
      return 0;
    }
    const std::vector<bench::DpStepRow> rows = bench::run_dp_step_bench(opt.dp, dev);
    if (rank == 0) bench::print_dp_step_rows(opt.dp, dev, rows);
    return 0;
  }

  if (opt.max_bytes == 0) opt.max_bytes = use_cuda ? int64_t(1) << 30 : int64_t(64) << 20;
  MPT_CHECK(opt.min_bytes <= opt.max_bytes,
            str("bench_comm: --min-bytes ", opt.min_bytes, " is larger than --max-bytes ", opt.max_bytes), "");

  if (rank == 0) {
    std::printf("bench_comm: %d rank(s) on %d node(s), device %s, dtype %s, sizes %s .. %s, %d iters after %d "
                "warm-up\n",
                world, nodes, use_cuda ? "cuda" : "cpu", dtype_name(opt.dtype), human_bytes(opt.min_bytes).c_str(),
                human_bytes(opt.max_bytes).c_str(), opt.iters, opt.warmup);
    std::printf("conventions (nccl-tests): time = max over ranks of the mean per-iteration time; algbw = size/time; "
                "busbw = algbw * 2(n-1)/n (all_reduce), (n-1)/n (reduce_scatter, all_gather; size = full buffer), "
                "1 (sendrecv); GB/s = 1e9 B/s\n");
    if (world == 1) std::printf("note: %s\n", kOneRankNote);
    std::fflush(stdout);
  }

  Bench bench(opt, dev);
  if (opt.backend != "nccl") bench.run_backend("mpi");
  if (opt.backend != "mpi") {
    std::string why;
    if (!nccl_built()) why = "this build has no NCCL (configured with MPITRON_CUDA=OFF or without nvcc)";
    else if (opt.device == "cpu") why = "--device cpu: NCCL moves device tensors (run with --device cuda)";
    else if (!use_cuda) why = str("no usable GPU: ", why_no_gpu);
    else {
      const bool own_gpu = grid.local_size() <= cuda_device_count();
      all_ok(own_gpu,
             own_gpu ? "" : str(grid.local_size(), " ranks on a node with ", cuda_device_count(),
                                " GPU(s): NCCL needs one GPU per rank"),
             why);
    }
    if (why.empty()) bench.run_backend("nccl");
    else bench.skip("nccl", why);
  }
  bench.summary(nodes);
  bench.save_json(opt.json, nodes);
  return bench.failed() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
#if defined(MPITRON_CUDA_SIM)  // the simulated device's NCCL stand-in calls MPI from its streams' threads
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
#else
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
#endif
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  set_process_rank(world > 1 ? rank : -1);
  int rc = 0;
  try {
    rc = run(argc, argv, rank, world);
  } catch (const std::exception& e) {
    // Other ranks may be waiting in a collective: take the whole job down.
    std::fprintf(stderr, "bench_comm: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
