#include "model/training/train_stats.h"

#include <algorithm>
#include <cmath>

#include "parallel/job_exit.h"
#include "tensor/norm.h"

namespace mpitron {

double params_l2_norm(const ParamSet& ps, Communicator* mp) {
  Tensor sq = Tensor::zeros({1}, DType::F32, ps.values().device());
  for (const ParamInfo& p : ps.infos())
    if (p.canonical) sum_squares(ps.values().flat_range(p.offset, p.numel()), sq);
  if (mp) mp->all_reduce(sq, ReduceOp::Sum);
  return std::sqrt(static_cast<double>(sq.item()));
}

int64_t count_zero_grads(const ParamSet& ps, const Tensor& grads, int64_t begin, int64_t end, Communicator* mp,
                         MPI_Comm dp_comm) {
  int64_t zeros = 0;
  for (const ParamInfo& p : ps.infos()) {
    if (!p.canonical) continue;
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel());
    if (hi <= lo) continue;
    // Host copy of the slice: this runs only at log intervals, with the flag.
    const std::vector<float> g = grads.flat_range(lo - begin, hi - lo).to(Device::cpu()).to_floats();
    zeros += static_cast<int64_t>(std::count(g.begin(), g.end(), 0.0f));
  }
  if (dp_comm != MPI_COMM_NULL) allreduce_bounded(&zeros, 1, MPI_INT64_T, MPI_SUM, dp_comm, "zero gradients over dp");
  if (mp) {
    Tensor host = Tensor::empty({1}, DType::I64);
    *static_cast<int64_t*>(host.data_ptr()) = zeros;
    Tensor z = host.to(grads.device());
    mp->all_reduce(z, ReduceOp::Sum);
    zeros = *static_cast<const int64_t*>(z.to(Device::cpu()).data_ptr());
  }
  return zeros;
}

}  // namespace mpitron
