// parallel/schedule_sim.h — predicts a pipeline schedule's timeline and bubble
// before anything runs, and draws it (text rows, SVG).
//
// Time model: the checker's replay (schedule_replay.h) with costs. One F of one
// model chunk costs `forward`, one B `backward`; a send/recv pair completes
// p2p after the later of its two posts, and a rank that posted sends/recvs
// waits until all of them completed. With v chunks per rank a chunk holds 1/v
// of the rank's layers, so pass per-chunk costs (full-stage cost / v) when
// comparing schedules with different v.
#pragma once
#include <string>
#include <vector>

#include "parallel/schedule.h"

namespace mpitron::parallel {

// Costs of one model chunk (time units; a costs file from --profile-pipeline is
// in milliseconds). The backward is B (input gradient) + W (weight gradient):
//   weight < 0 (unset): `backward` is the whole backward; a schedule with W
//     actions runs B and W at backward / 2 each;
//   weight >= 0: `backward` is B alone and `weight` is W; a schedule without W
//     runs its B (the whole backward) at backward + weight.
// The stage_* vectors (index: global stage) override the scalars for the stages
// they cover; an entry < 0 means "use the scalar".
struct Costs {
  double forward = 1;   // one forward of one model chunk
  double backward = 2;  // one backward of one model chunk (default: 2x forward); B alone when weight >= 0
  double p2p = 0;       // one activation/gradient transfer between ranks
  double weight = -1;   // one W (weight gradient) of one model chunk; < 0: unset (see above)
  std::vector<double> stage_forward, stage_backward, stage_weight;

  // The cost of `op` on global stage `stage` in a schedule that does (split) or
  // does not split its backward into B and W.
  double cost(Op op, int stage, bool split) const;
};

// The costs file (written by write_costs_file, e.g. from pipeline_exec's
// PipelineProfile via pretrain_gpt --profile-pipeline; times in milliseconds):
//   # comment
//   stage 0 F 1.25 B 1.10 W 0.95     (W may be left out: B is then the whole backward)
//   stage 1 F 1.31 B 1.18 W 0.97
//   p2p 0.08
// Errors name FILE:LINE:COLUMN.
Costs parse_costs(const std::string& text, const std::string& source = "<costs>");
Costs read_costs_file(const std::string& path);
std::string write_costs(const Costs& c);
void write_costs_file(const Costs& c, const std::string& path);
// Costs measured with `from` stages used for a schedule with `stages` stages
// (e.g. measured with 1F1B, pp 4 — 4 stages — and simulated for zbv, pp 4 — 8
// stages): when stages is a multiple of from, each measured stage splits evenly
// into stages / from chunks (costs divided); when from is a multiple of stages,
// neighbouring measured stages are summed. Throws otherwise.
Costs fit_costs_to_stages(const Costs& c, int stages);

struct TimelineEntry {
  int first = 0;       // index into schedule.ranks[rank]
  int count = 1;       // actions covered: 1 for F/B/W, the batch size for send/recv
  bool compute = true; // F/B/W (busy) or send/recv (posted .. completed)
  double start = 0, end = 0;
};

struct Timeline {
  std::vector<std::vector<TimelineEntry>> ranks;  // per rank, in order
  std::vector<double> busy;                       // per rank: time spent in F/B/W
  std::vector<double> finish;                     // per rank: end of its last action
  std::vector<int> peak_in_flight;                // per rank: most forwards awaiting their W (or B without W)
  double total = 0;                               // makespan (step time): the last rank's finish
  double ideal = 0;                               // the busiest rank's F/B/W time (no bubble, no p2p)
  double bubble_fraction = 0;                     // (total - ideal) / total
};

// Checks the schedule first (throws mpitron::Error with the checker's message).
Timeline simulate_schedule(const Schedule& s, const Costs& costs = {});

// The textbook bubble with equal stage costs and free p2p: (p-1)/(v*m + p-1).
double formula_bubble_fraction(int pp, int micro_batches, int virtual_stages = 1);

// The closed-form bubble fraction of a built-in with equal per-chunk costs
// F = B = W and free p2p (docs/pipeline-schedules.md, "Bubbles in closed form"):
//   gpipe, 1f1b:  (p-1)/(m+p-1)       interleaved: (p-1)/(v*m+p-1)
//   zb-h1:        (p-1)/(3m+p-1)      zbv:         (p-1)/(6m+p-1)
// zb-h1's holds for m >= p. zbv's is the lower bound (the last rank idles
// (p-1) F at the start); the generated zbv meets it for p = 2, 4, 8 and
// m = p, 2p, 3p (tested) and comes within a few units elsewhere. Returns -1 for
// a name without a formula.
double analytic_bubble_fraction(const std::string& name, int pp, int micro_batches, int virtual_stages = 1);
// The formula analytic_bubble_fraction uses, as text ("(p-1)/(3m+p-1)"); "" when none.
std::string analytic_bubble_formula(const std::string& name);

// One row per rank; `unit` time per character cell group, labels in boxes:
//   rank 0 |F0 F1 F2 F3 ......|B0    B1 ...
// Rows are cut at max_width characters (a note says so).
std::string timeline_text(const Schedule& s, const Timeline& t, size_t max_width = 200);
// Every action with start/end: "rank 0: F0.0 [0,1) F1.0 [1,2) ...".
std::string timeline_list(const Schedule& s, const Timeline& t);
// A standalone SVG document: one row per rank, F/B/W boxes (colour by kind,
// shade by chunk) labelled with micro-batch[.chunk], p2p waits as thin bars.
std::string timeline_svg(const Schedule& s, const Timeline& t);

}  // namespace mpitron::parallel
