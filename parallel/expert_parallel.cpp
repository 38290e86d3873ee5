#include "parallel/expert_parallel.h"

#include <numeric>

#include "core/error.h"
#include "tensor/moe_permute.h"

namespace mpitron {

MoeDispatcher parse_moe_dispatcher(const std::string& s) {
  if (s == "allgather") return MoeDispatcher::AllGather;
  if (s == "alltoall") return MoeDispatcher::AllToAll;
  MPT_THROW(str("--moe-token-dispatcher-type ", s, " is not supported"), "use allgather or alltoall");
}

const char* moe_dispatcher_name(MoeDispatcher d) { return d == MoeDispatcher::AllToAll ? "alltoall" : "allgather"; }

namespace {

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

// Rows [begin, begin + n) of a (R, C) tensor.
Tensor row_range(const Tensor& t, int64_t begin, int64_t n) { return t.slice(0, begin, begin + n); }

std::vector<int64_t> times(std::vector<int64_t> v, int64_t c) {
  for (int64_t& x : v) x *= c;
  return v;
}

// The alltoall of rows: rank j gets rows [Σ_{i<j} send[i], …+ send[j]) of `from`; rows from rank j land
// at [Σ_{i<j} recv[i], …+ recv[j]) of `to` (this rank's own piece copied). One batch of p2p messages,
// empty pieces skipped (both sides know every count).
void swap_rows(Communicator& comm, const Tensor& from, const std::vector<int64_t>& send, const Tensor& to,
               const std::vector<int64_t>& recv) {
  std::vector<Communicator::P2POp> ops;
  int64_t so = 0, ro = 0;
  for (int j = 0; j < comm.size(); ++j) {
    const int64_t s = send[static_cast<size_t>(j)], r = recv[static_cast<size_t>(j)];
    if (j == comm.rank()) {
      if (s > 0) row_range(to, ro, r).copy_from(row_range(from, so, s));
    } else {
      if (s > 0) ops.push_back({true, row_range(from, so, s), j, 0});
      if (r > 0) ops.push_back({false, row_range(to, ro, r), j, 0});
    }
    so += s, ro += r;
  }
  if (!ops.empty()) comm.batch_p2p_async(ops)->wait();
}

}  // namespace

ExpertExchange::ExpertExchange(const ExpertParallel& ep, const std::vector<int64_t>& counts, Device dev) : ep_(ep) {
  const int P = ep.size, me = ep.rank;
  experts_ = static_cast<int64_t>(counts.size());
  MPT_CHECK(ep.active() && ep.comm && ep.comm->size() == P && ep.comm->rank() == me,
            str("expert exchange: the ep group (size ", P, ", rank ", me, ") has no matching communicator"), "");
  MPT_CHECK(experts_ % P == 0,
            str("--expert-model-parallel-size ", P, " does not divide the ", experts_, " experts"), "");
  local_ = experts_ / P;
  const int64_t E = experts_, El = local_, first = ep.first(E);
  rows_ = sum(counts);
  // Every rank's counts (one all-gather of E integers).
  {
    const Tensor mine = Tensor::from_ints(counts, {E}, DType::I64).to(dev);
    const Tensor all = Tensor::empty({P * E}, DType::I64, dev);
    ep.comm->all_gather(mine, all);
    const Tensor host = all.to(Device::cpu());
    all_counts_.assign(host.data<int64_t>(), host.data<int64_t>() + P * E);
  }
  auto count = [&](int s, int64_t e) { return all_counts_[static_cast<size_t>(s * E + e)]; };
  local_counts_.assign(static_cast<size_t>(El), 0);
  for (int s = 0; s < P; ++s)
    for (int64_t l = 0; l < El; ++l) local_counts_[static_cast<size_t>(l)] += count(s, first + l);
  local_rows_ = sum(local_counts_);
  // xe row of (source s, local expert l, i-th row): base[l] + Σ_{s' < s} count(s', first + l) + i.
  std::vector<int64_t> base(static_cast<size_t>(El), 0);
  for (int64_t l = 1; l < El; ++l) base[static_cast<size_t>(l)] = base[static_cast<size_t>(l - 1)] + local_counts_[static_cast<size_t>(l - 1)];
  std::vector<int64_t> at = base;  // running position per local expert, source by source
  std::vector<int64_t> regroup;
  if (ep.dispatcher == MoeDispatcher::AllToAll) {
    send_.assign(static_cast<size_t>(P), 0);
    recv_.assign(static_cast<size_t>(P), 0);
    for (int j = 0; j < P; ++j)
      for (int64_t l = 0; l < El; ++l) send_[static_cast<size_t>(j)] += counts[static_cast<size_t>(j * El + l)];
    // Received source by source, each source's rows by local expert.
    for (int s = 0; s < P; ++s)
      for (int64_t l = 0; l < El; ++l) {
        const int64_t c = count(s, first + l);
        recv_[static_cast<size_t>(s)] += c;
        for (int64_t i = 0; i < c; ++i) regroup.push_back(at[static_cast<size_t>(l)]++);
      }
  } else {
    gathered_.assign(static_cast<size_t>(P), 0);
    for (int s = 0; s < P; ++s)
      for (int64_t e = 0; e < E; ++e) {
        const int64_t c = count(s, e);
        gathered_[static_cast<size_t>(s)] += c;
        const bool local = e >= first && e < first + El;
        for (int64_t i = 0; i < c; ++i) regroup.push_back(local ? at[static_cast<size_t>(e - first)]++ : -1);
      }
  }
  regroup_ = Tensor::from_ints(regroup, {static_cast<int64_t>(regroup.size())}, DType::I32).to(dev);
}

Tensor ExpertExchange::to_experts(const Tensor& xp) const {
  MPT_CHECK(xp.ndim() == 2 && xp.dim(0) == rows_,
            str("expert exchange: to_experts takes the (", rows_, ", C) permuted rows, got ", xp.describe()), "");
  const int64_t C = xp.dim(1);
  const Tensor x = xp.contiguous();
  Tensor xe = Tensor::empty({local_rows_, C}, xp.dtype(), xp.device());
  if (ep_.dispatcher == MoeDispatcher::AllToAll) {
    Tensor recv = Tensor::empty({local_rows_, C}, xp.dtype(), xp.device());  // source by source
    swap_rows(*ep_.comm, x, send_, recv, recv_);
    if (local_rows_ > 0) moe_permute(recv, regroup_, xe);
    return xe;
  }
  const int64_t G = sum(gathered_);
  Tensor all = Tensor::empty({G, C}, xp.dtype(), xp.device());
  ep_.comm->all_gather_v(x.view({rows_ * C}), all.view({G * C}), times(gathered_, C));
  if (G > 0) moe_permute(all, regroup_, xe);
  return xe;
}

Tensor ExpertExchange::from_experts(const Tensor& ye) const {
  MPT_CHECK(ye.ndim() == 2 && ye.dim(0) == local_rows_,
            str("expert exchange: from_experts takes the experts' (", local_rows_, ", C) rows, got ", ye.describe()), "");
  const int64_t C = ye.dim(1);
  const Tensor y = ye.contiguous();
  Tensor yp = Tensor::empty({rows_, C}, ye.dtype(), ye.device());
  if (ep_.dispatcher == MoeDispatcher::AllToAll) {
    Tensor back = Tensor::empty({local_rows_, C}, ye.dtype(), ye.device());  // source by source
    if (local_rows_ > 0) moe_permute_backward(y, regroup_, back);
    swap_rows(*ep_.comm, back, recv_, yp, send_);  // the way there, reversed
    return yp;
  }
  const int64_t G = sum(gathered_);
  Tensor all = Tensor::empty({G, C}, ye.dtype(), ye.device());
  if (G > 0) moe_permute_backward(y, regroup_, all);  // rows of other ranks' experts: zero
  ep_.comm->reduce_scatter_v(all.view({G * C}), yp.view({rows_ * C}), times(gathered_, C));
  return yp;
}

}  // namespace mpitron
