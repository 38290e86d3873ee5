// parallel/schedule.h — a pipeline schedule is DATA: for each pipeline rank, the
// ordered list of actions it runs in one training step.
//
// Stages and chunks (Megatron's virtual pipeline): the model is cut into
// S = pp * virtual_stages stages; stage s lives on pipeline rank s % pp as that
// rank's local model chunk s / pp (round-robin, as --num-layers-per-virtual-
// pipeline-stage assigns them). An action names the LOCAL chunk, so on rank r
// chunk c is global stage c * pp + r.
//
// Actions (text form in brackets, see docs/pipeline-schedules.md):
//   F  forward of (mb, chunk)                               [F3.1]
//   B  backward of (mb, chunk)                              [B3.1]
//   SA send the output activation of F(mb, chunk) to peer   [SA3.1>2]
//   RA receive the input activation of F(mb, chunk) from    [RA3.1<0]
//   SG send the input gradient made by B(mb, chunk) to peer [SG3.1>0]
//   RG receive the output gradient B(mb, chunk) needs from  [RG3.1<2]
// Consecutive send/recv actions may be posted together as one batch (Megatron's
// batch_isend_irecv, e.g. send_forward_recv_backward): `[SA3.0>1 RG1.0<1]`.
// The checker (schedule_check.h) states the point-to-point semantics.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mpitron::parallel {

enum class Op : uint8_t { Forward, Backward, SendAct, RecvAct, SendGrad, RecvGrad };

inline bool is_compute(Op op) { return op == Op::Forward || op == Op::Backward; }
inline bool is_send(Op op) { return op == Op::SendAct || op == Op::SendGrad; }
inline bool is_recv(Op op) { return op == Op::RecvAct || op == Op::RecvGrad; }

struct Action {
  Op op = Op::Forward;
  int mb = 0;            // micro-batch, [0, micro_batches)
  int chunk = 0;         // LOCAL model chunk on this rank, [0, virtual_stages)
  int peer = -1;         // the other pipeline rank of a send/recv; -1 for F/B
  bool batched = false;  // posted in one batch with the action before it (both p2p)
  int line = 0;          // where a parsed action was read (1-based; 0 when generated)
  int column = 0;

  bool operator==(const Action& o) const {  // source position is not identity
    return op == o.op && mb == o.mb && chunk == o.chunk && peer == o.peer && batched == o.batched;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
};

// "F3.1", "SA3.1>2", "RG0.0<1" (no batch brackets: see write_schedule).
std::string to_string(const Action& a);
// The text of the action (op, mb, chunk, peer) without building one: "SA3.1>2".
std::string action_text(Op op, int mb, int chunk, int peer = -1);

struct Schedule {
  std::string name;                        // "gpipe", "1f1b", "interleaved" or the file it came from
  int pp = 1;                              // pipeline-parallel size (ranks)
  int virtual_stages = 1;                  // model chunks per rank (1: no virtual pipeline)
  int micro_batches = 1;                   // micro-batches per step
  std::vector<std::vector<Action>> ranks;  // ranks[r]: actions of pipeline rank r, in order

  int stages() const { return pp * virtual_stages; }
  int stage(int rank, int chunk) const { return chunk * pp + rank; }
  int rank_of_stage(int s) const { return s % pp; }
  int chunk_of_stage(int s) const { return s / pp; }
  size_t action_count() const;
};

// ---- built-ins (explicit send/recv, ready to check and run) -------------------
// GPipe: every forward, then every backward (micro-batch order 0..m-1 both).
Schedule gpipe_schedule(int pp, int micro_batches);
// 1F1B (PipeDream-flush, Megatron's non-interleaved schedule): rank r runs
// min(pp - r - 1, m) warm-up forwards, then alternates one forward / one
// backward, then drains the remaining backwards.
Schedule one_f_one_b_schedule(int pp, int micro_batches);
// Megatron's interleaved 1F1B with `virtual_stages` chunks per rank. Like
// Megatron, micro_batches must be a multiple of pp (throws otherwise).
Schedule interleaved_schedule(int pp, int micro_batches, int virtual_stages);
// By name: "gpipe", "1f1b" (virtual_stages must be 1), "interleaved".
Schedule builtin_schedule(const std::string& name, int pp, int micro_batches, int virtual_stages = 1);
// True for the names builtin_schedule knows.
bool is_builtin_schedule(const std::string& name);

// ---- send/recv ------------------------------------------------------------------
// True when any rank holds a send or recv.
bool has_p2p(const Schedule& s);
// Inserts the point-to-point actions a compute-only schedule implies: RA before
// every F whose input comes from another rank, SA after every F whose output
// goes to another rank, RG/SG likewise around B; each run of consecutive
// send/recv actions between two computes becomes one batch (so F, SA, RG, B
// posts send_forward_recv_backward as Megatron does). Throws if `s` already
// holds p2p actions.
Schedule with_p2p(const Schedule& s);
// Drops every send/recv (the inverse of with_p2p, for display and editing).
Schedule compute_only(const Schedule& s);

// ---- text format (docs/pipeline-schedules.md) ----------------------------------
// Parses the line format. `source` names the text in errors, which read
// "<source>:<line>:<column>: <what>". A schedule that says `p2p auto` (the
// default) holds only F/B and gets its send/recv from with_p2p.
Schedule parse_schedule(const std::string& text, const std::string& source = "<schedule>");
Schedule read_schedule_file(const std::string& path);
// Writes the line format (p2p explicit when the schedule holds sends/recvs,
// otherwise p2p auto); parse_schedule(write_schedule(s)) == s.
std::string write_schedule(const Schedule& s);
void write_schedule_file(const Schedule& s, const std::string& path);

bool operator==(const Schedule& a, const Schedule& b);  // everything but name
inline bool operator!=(const Schedule& a, const Schedule& b) { return !(a == b); }

}  // namespace mpitron::parallel
