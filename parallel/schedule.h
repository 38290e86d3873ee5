// parallel/schedule.h — a pipeline schedule is DATA: for each pipeline rank, the
// ordered list of actions it runs in one training step.
//
// Stages and chunks (Megatron's virtual pipeline): the model is cut into
// S = pp * virtual_stages stages. The PLACEMENT maps each stage to a rank:
//   round-robin (default, as --num-layers-per-virtual-pipeline-stage assigns
//     them): stage s on rank s % pp as that rank's local chunk s / pp;
//   v (V-shape, virtual_stages 2): stage s < pp on rank s (chunk 0), stage
//     s >= pp on rank 2pp-1-s (chunk 1), so rank 0 holds the first and the last;
//   explicit: any list of pp*v ranks in which every rank appears v times; a
//     rank's local chunks are its stages in ascending order.
// An action names the LOCAL chunk; Schedule::stage(rank, chunk),
// rank_of_stage(s) and chunk_of_stage(s) convert (never c * pp + r directly).
//
// Actions (text form in brackets, see docs/pipeline-schedules.md):
//   F  forward of (mb, chunk)                               [F3.1]
//   B  backward of (mb, chunk); when the schedule has W     [B3.1]
//      actions, B computes the input gradient only and
//      saves what W needs
//   W  weight gradients of (mb, chunk) (zero-bubble split)  [W3.1]
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

enum class Op : uint8_t { Forward, Backward, SendAct, RecvAct, SendGrad, RecvGrad, Weight };

// F, B and W run on the rank itself (no send/recv).
inline bool is_compute(Op op) { return op == Op::Forward || op == Op::Backward || op == Op::Weight; }
inline bool is_send(Op op) { return op == Op::SendAct || op == Op::SendGrad; }
inline bool is_recv(Op op) { return op == Op::RecvAct || op == Op::RecvGrad; }

// Bounds on a schedule's size, built-in or read from a file: far above any
// training step (Megatron steps run at most thousands of micro-batches) and
// small enough that building, checking and simulating one takes seconds and
// megabytes, not a killed process.
constexpr int64_t kMaxPipelineRanks = 4096;          // pp
constexpr int64_t kMaxVirtualStages = 256;           // model chunks per rank
constexpr int64_t kMaxScheduleForwards = 1 << 20;    // pp · virtual stages · micro-batches
// Throws naming `what` (a flag or file:line) and the bound when one is exceeded.
void check_schedule_size(const std::string& what, int64_t pp, int64_t micro_batches, int64_t virtual_stages);

struct Action {
  Op op = Op::Forward;
  int mb = 0;            // micro-batch, [0, micro_batches)
  int chunk = 0;         // LOCAL model chunk on this rank, [0, virtual_stages)
  int peer = -1;         // the other pipeline rank of a send/recv; -1 for F/B/W
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
  std::string source;                      // the file it was parsed from ("" when generated), for errors
  int pp = 1;                              // pipeline-parallel size (ranks)
  int virtual_stages = 1;                  // model chunks per rank (1: no virtual pipeline)
  int micro_batches = 1;                   // micro-batches per step
  // Stage -> rank map, size pp * virtual_stages; EMPTY means round-robin
  // (stage s on rank s % pp). Set it with v_placement() or an explicit list;
  // placement_error() says whether it is valid.
  std::vector<int> placement;
  int max_in_flight = 0;                   // `max-in-flight N` bound the checker enforces (0: none)
  std::vector<std::vector<Action>> ranks;  // ranks[r]: actions of pipeline rank r, in order

  int stages() const { return pp * virtual_stages; }
  // Global stage of local chunk `chunk` on `rank`.
  int stage(int rank, int chunk) const;
  // The rank holding global stage s, and s's local chunk there.
  int rank_of_stage(int s) const;
  int chunk_of_stage(int s) const;
  // The stage -> rank map in effect (round-robin filled in when `placement` is empty).
  std::vector<int> stage_ranks() const;
  // "round-robin", "v" or "explicit" (what write_schedule writes as the header).
  std::string placement_kind() const;
  size_t action_count() const;
};

// The V placement for pp ranks (2 chunks each): [0, 1, ..., pp-1, pp-1, ..., 1, 0].
std::vector<int> v_placement(int pp);
// "" when `placement` (stage -> rank, or empty for round-robin) is valid for
// pp ranks with v chunks each; otherwise what is wrong.
std::string placement_error(const std::vector<int>& placement, int pp, int virtual_stages);
// True when any rank holds a W action (the schedule splits backward into B and W).
bool has_weight_actions(const Schedule& s);

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
// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): backward split
// into B (input gradient) and W (weight gradient). Rank r runs 1F1B's
// min(pp - r - 1, m) warm-up forwards, then F, B and — deferred by r
// micro-batches — W; the deferred Ws fill the cool-down. Peak in-flight (F run,
// W not yet) is min(pp, m) on every rank: 1F1B's peak. With F = B = W the
// bubble is (pp-1)/(3m+pp-1) for m >= pp, against 1F1B's (pp-1)/(m+pp-1).
Schedule zb_h1_schedule(int pp, int micro_batches);
// ZB-V: V placement (virtual_stages 2: rank r holds stages r and 2pp-1-r),
// split backward, peak in-flight at most 2pp chunks per rank (1F1B's memory:
// pp micro-batches of a whole rank). Generated by a list scheduler on unit
// costs: a free rank runs a forward (the later stage first) while under the
// memory bound, else a backward (the later stage first), else the oldest
// pending W. With F = B = W it reaches the warm-up bound, bubble
// (pp-1)/(6m+pp-1), for pp = 2, 4, 8 and m = pp, 2pp, 3pp (tested), and comes
// within a few time units of it elsewhere (docs/pipeline-schedules.md).
Schedule zbv_schedule(int pp, int micro_batches);
// By name: "gpipe", "1f1b" (virtual_stages must be 1), "interleaved", "zb-h1"
// (virtual_stages 1), "zbv" (virtual_stages 2).
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
// Inserts send/recv from a unit-cost timeline: every F, B and W takes one time
// unit and runs as early as its order and inputs allow; a message produced at
// time t is sent at t and received at t, in one batch per rank per t. Both
// sides of every message post at the same logical time, so the result is
// deadlock-free for ANY dependency-respecting compute order (p2p auto, which
// posts just in time, can deadlock for V and zero-bubble orders). Throws when
// the compute order cannot run (a forward before its input, ...), naming the
// stuck actions, or when `s` already holds p2p actions.
Schedule with_timed_p2p(const Schedule& s);
// Drops every send/recv (the inverse of with_p2p, for display and editing).
Schedule compute_only(const Schedule& s);

// ---- text format (docs/pipeline-schedules.md) ----------------------------------
// Parses the line format. `source` names the text in errors, which read
// "<source>:<line>:<column>: <what>". A schedule that says `p2p auto` (the
// default) holds only F/B/W and gets its send/recv from with_p2p; `p2p timed`
// from with_timed_p2p.
Schedule parse_schedule(const std::string& text, const std::string& source = "<schedule>");
Schedule read_schedule_file(const std::string& path);
// Writes the line format (p2p explicit when the schedule holds sends/recvs,
// otherwise p2p auto); parse_schedule(write_schedule(s)) == s.
std::string write_schedule(const Schedule& s);
void write_schedule_file(const Schedule& s, const std::string& path);

bool operator==(const Schedule& a, const Schedule& b);  // everything but name
inline bool operator!=(const Schedule& a, const Schedule& b) { return !(a == b); }

}  // namespace mpitron::parallel
