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

struct Costs {
  double forward = 1;   // one forward of one model chunk (time units)
  double backward = 2;  // one backward of one model chunk (default: 2x forward)
  double p2p = 0;       // one activation/gradient transfer between ranks
};

struct TimelineEntry {
  int first = 0;       // index into schedule.ranks[rank]
  int count = 1;       // actions covered: 1 for F/B, the batch size for send/recv
  bool compute = true; // F/B (busy) or send/recv (posted .. completed)
  double start = 0, end = 0;
};

struct Timeline {
  std::vector<std::vector<TimelineEntry>> ranks;  // per rank, in order
  std::vector<double> busy;                       // per rank: time spent in F/B
  std::vector<double> finish;                     // per rank: end of its last action
  std::vector<int> peak_in_flight;                // per rank: most forwards awaiting their backward
  double total = 0;                               // makespan: the last rank's finish
  double ideal = 0;                               // the busiest rank's F/B time (no bubble, no p2p)
  double bubble_fraction = 0;                     // (total - ideal) / total
};

// Checks the schedule first (throws mpitron::Error with the checker's message).
Timeline simulate_schedule(const Schedule& s, const Costs& costs = {});

// The textbook bubble with equal stage costs and free p2p: (p-1)/(v*m + p-1).
double formula_bubble_fraction(int pp, int micro_batches, int virtual_stages = 1);

// One row per rank; `unit` time per character cell group, labels in boxes:
//   rank 0 |F0 F1 F2 F3 ......|B0    B1 ...
// Rows are cut at max_width characters (a note says so).
std::string timeline_text(const Schedule& s, const Timeline& t, size_t max_width = 200);
// Every action with start/end: "rank 0: F0.0 [0,1) F1.0 [1,2) ...".
std::string timeline_list(const Schedule& s, const Timeline& t);
// A standalone SVG document: one row per rank, F/B boxes (colour by kind,
// shade by chunk) labelled with micro-batch[.chunk], p2p waits as thin bars.
std::string timeline_svg(const Schedule& s, const Timeline& t);

}  // namespace mpitron::parallel
