#include "model/training/host_groups.h"

#include <algorithm>
#include <cstring>

#include "tensor/tensor.h"

namespace mpitron {

HostGroups::HostGroups(const ParallelContext& par) : par_(par) {
  make(world(), "world (host scalars)");
  make(par.dp_comm, "dp (host scalars)");
  make(par.pp_comm, "pp (host scalars)");
  make(par.cp_comm, "cp (host scalars)");  // the loss's mean over the cp ranks
}

void HostGroups::make(MPI_Comm c, const char* name) {
  if (c == MPI_COMM_NULL || comms_.count(c)) return;
  CommOptions o;
  o.name = name;
  comms_[c] = make_mpi_communicator(c, o);
}

std::vector<double> HostGroups::gather_over(MPI_Comm comm, const std::vector<double>& v) const {
  if (comm == MPI_COMM_NULL) return v;
  // Doubles as their bits (the communicators reduce no f64).
  Communicator& c = host(comm);
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<int64_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(double));
  Tensor in = Tensor::from_ints(bits, {n}, DType::I64), out = Tensor::empty({c.size() * n}, DType::I64);
  c.all_gather(in, out);
  std::vector<double> all(static_cast<size_t>(c.size() * n));
  std::memcpy(all.data(), out.data<int64_t>(), all.size() * sizeof(double));
  return all;
}

std::vector<double> HostGroups::sum_over(MPI_Comm comm, std::vector<double> v) const {
  if (comm == MPI_COMM_NULL) return v;
  // Gathered, then summed in rank order: every rank gets the same bits.
  const std::vector<double> all = gather_over(comm, v);
  const size_t n = v.size();
  std::vector<double> sum(n, 0.0);
  for (size_t r = 0; r < all.size() / std::max<size_t>(n, 1); ++r)
    for (size_t i = 0; i < n; ++i) sum[i] += all[r * n + i];
  return sum;
}

std::vector<double> HostGroups::last_stage_mean(std::vector<double> v, double count) const {
  v = sum_over(par_.pp_comm, std::move(v));
  v = sum_over(par_.cp_comm, std::move(v));
  for (double& x : v) x /= static_cast<double>(par_.cp_size);
  v = sum_over(par_.dp_comm, std::move(v));
  for (double& x : v) x /= count;
  return v;
}

int HostGroups::world_or(int v) const {
  if (world() == MPI_COMM_NULL) return v;
  std::vector<int32_t> bits(31);
  for (int b = 0; b < 31; ++b) bits[static_cast<size_t>(b)] = (v >> b) & 1;
  Tensor t = Tensor::from_ints(std::vector<int64_t>(bits.begin(), bits.end()), {31}, DType::I32);
  host(world()).all_reduce(t, ReduceOp::Max);
  int out = 0;
  for (int b = 0; b < 31; ++b) out |= (t.data<int32_t>()[b] != 0 ? 1 : 0) << b;
  return out;
}

}  // namespace mpitron
