// model/training/train_stats.h — the optional numbers of Megatron's log line:
// --log-params-norm (L2 norm of the weights) and --log-num-zeros-in-grad (how
// many gradient elements are exactly 0 after reduction). Both count each
// parameter once across the model-parallel group (ParamInfo::canonical), as the
// grad norm does; neither changes training.
#pragma once
#include <mpi.h>

#include <cstdint>

#include "model/params.h"
#include "parallel/communicator.h"

namespace mpitron {

// sqrt(Σ w²) over this rank's canonical parameters (compute-dtype values),
// summed over `mp` (tp × pp; may be null for one process).
double params_l2_norm(const ParamSet& ps, Communicator* mp);

// Zero elements among the reduced gradients of canonical parameters in
// [begin, end) of the flat buffer; grads: (end - begin) f32, those gradients (the
// whole buffer, or this rank's ZeRO shard holding the reduced sums), summed over `mp`
// and, when the gradients are sharded, over the data-parallel group `dp_comm`
// (MPI_COMM_NULL otherwise).
int64_t count_zero_grads(const ParamSet& ps, const Tensor& grads, int64_t begin, int64_t end, Communicator* mp,
                         MPI_Comm dp_comm);

}  // namespace mpitron
