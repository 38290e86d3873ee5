// apps/schedule_sim.cpp — check a pipeline schedule and predict its timeline:
//   schedule_sim --schedule 1f1b --pp 4 --micro-batches 8
//   schedule_sim --schedule interleaved --pp 4 --micro-batches 8 --virtual-stages 2 --svg out.svg
//   schedule_sim --schedule zb-h1 --pp 4 --micro-batches 8 --forward-cost 1 --backward-cost 1 --weight-cost 1
//   schedule_sim --schedule zbv --pp 4 --micro-batches 8 --virtual-stages 2
//   schedule_sim --schedule-file my.sched --forward-cost 1 --backward-cost 2 --p2p-cost 0.1
//   schedule_sim --schedule-file my.sched --costs measured.costs   (pretrain_gpt --profile-pipeline)
// Prints one timeline row per rank, the step time, the bubble fraction (and,
// for built-ins, the closed form for equal costs), peak in-flight per rank;
// --svg draws the timeline, --write-schedule saves the (built-in) schedule as a
// file to edit. A bad schedule is rejected with the checker's message (exit 1).
#include <boost/program_options.hpp>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "core/error.h"
#include "model/flags/flag_given.h"
#include "parallel/schedule.h"        // Schedule, built-ins, the text format
#include "parallel/schedule_check.h"  // check_schedule: complete and deadlock-free
#include "parallel/schedule_sim.h"    // simulate_schedule, timeline text/SVG

namespace po = boost::program_options;
using namespace mpitron;
using namespace mpitron::parallel;

int main(int argc, char** argv) {
  std::string schedule_name, schedule_file, svg_path, write_path, costs_path;
  int pp = 0, micro_batches = 0, virtual_stages = 1;
  Costs costs;
  double backward_cost = -1, weight_cost = -1;
  size_t width = 200;
  po::options_description desc("schedule_sim: check a pipeline schedule and predict its timeline and bubble");
  desc.add_options()("help,h", "show this help")(
      "schedule", po::value(&schedule_name), "built-in: gpipe, 1f1b, interleaved, zb-h1 or zbv")(
      "schedule-file", po::value(&schedule_file), "a schedule file (docs/pipeline-schedules.md)")(
      "pp", po::value(&pp), "pipeline-parallel size (built-ins)")(
      "micro-batches", po::value(&micro_batches), "micro-batches per step (built-ins)")(
      "virtual-stages", po::value(&virtual_stages)->default_value(1), "model chunks per rank (interleaved; zbv: 2)")(
      "forward-cost", po::value(&costs.forward)->default_value(1.0), "time of one forward of one model chunk")(
      "backward-cost", po::value(&backward_cost),
      "time of one backward of one model chunk (default 2x forward); with --weight-cost: the input-gradient part B "
      "(default = forward)")(
      "weight-cost", po::value(&weight_cost),
      "time of one weight-gradient W of one model chunk; a schedule without W runs B + W as its backward (default: "
      "unset, a split B and W each cost backward / 2)")(
      "p2p-cost", po::value(&costs.p2p)->default_value(0.0), "time of one activation/gradient transfer")(
      "costs", po::value(&costs_path),
      "per-stage F/B/W and p2p costs from a file (pretrain_gpt --profile-pipeline; replaces the cost flags)")(
      "svg", po::value(&svg_path), "write the timeline as an SVG file")(
      "write-schedule", po::value(&write_path), "write the schedule in the text format (a start for your own)")(
      "list", "also print every action with its start and end time")(
      "width", po::value(&width)->default_value(200), "cut timeline rows at this many characters");
  try {
    po::variables_map vm;
    const po::parsed_options parsed = po::parse_command_line(argc, argv, desc);
    check_parsed_values(parsed, desc, "schedule_sim");
    po::store(parsed, vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
    if (vm.count("schedule") == vm.count("schedule-file"))
      throw po::error("give exactly one of --schedule (a built-in) and --schedule-file");
    if (weight_cost >= 0) {
      costs.weight = weight_cost;
      costs.backward = backward_cost > 0 ? backward_cost : costs.forward;
    } else {
      costs.backward = backward_cost > 0 ? backward_cost : 2 * costs.forward;
    }
    if (!costs_path.empty() && (vm.count("backward-cost") || vm.count("weight-cost") || !vm["forward-cost"].defaulted() ||
                                !vm["p2p-cost"].defaulted()))
      throw po::error("--costs replaces --forward-cost, --backward-cost, --weight-cost and --p2p-cost: give one or the other");

    Schedule s;
    bool builtin = vm.count("schedule") > 0;
    if (builtin) {
      if (pp < 1 || micro_batches < 1) throw po::error("a built-in schedule needs --pp and --micro-batches (>= 1)");
      s = builtin_schedule(schedule_name, pp, micro_batches, virtual_stages);
    } else {
      s = read_schedule_file(schedule_file);
    }
    if (!write_path.empty()) write_schedule_file(s, write_path);

    CheckResult check = check_schedule(s);
    if (!check.ok) {
      std::cerr << "schedule_sim: " << check.located() << "schedule '" << s.name << "' rejected: " << check.message()
                << "\n";
      return 1;
    }
    const bool split = has_weight_actions(s);
    if (!costs_path.empty()) costs = fit_costs_to_stages(read_costs_file(costs_path), s.stages());
    Timeline t = simulate_schedule(s, costs);

    std::cout << "schedule " << s.name << ": pp " << s.pp << ", micro-batches " << s.micro_batches
              << ", virtual stages " << s.virtual_stages << ", placement " << s.placement_kind()
              << (split ? ", split backward (B + W)" : "") << "\n";
    if (costs_path.empty()) {
      std::cout << "costs per model chunk: F " << costs.forward;
      if (split) std::cout << " B " << costs.cost(Op::Backward, 0, true) << " W " << costs.cost(Op::Weight, 0, true);
      else std::cout << " B " << costs.cost(Op::Backward, 0, false) << (costs.weight >= 0 ? " (B + W: no split)" : "");
      std::cout << " p2p " << costs.p2p << "\n";
    } else {
      std::cout << "costs from " << costs_path << " (per stage";
      if (!costs.stage_forward.empty() && static_cast<int>(read_costs_file(costs_path).stage_forward.size()) != s.stages())
        std::cout << ", measured stages split or summed to " << s.stages();
      std::cout << "):\n";
      for (int st = 0; st < s.stages(); ++st) {
        std::cout << "  stage " << st << " F " << costs.cost(Op::Forward, st, split) << " B "
                  << costs.cost(Op::Backward, st, split);
        if (split) std::cout << " W " << costs.cost(Op::Weight, st, split);
        std::cout << "\n";
      }
      std::cout << "  p2p " << costs.p2p << "\n";
    }
    std::cout << "check: ok (complete, dependencies respected, deadlock-free under blocking send/recv)\n\n";
    std::cout << timeline_text(s, t, width) << "\n";
    if (vm.count("list")) std::cout << timeline_list(s, t) << "\n";
    std::cout << std::fixed << std::setprecision(4);
    std::cout << "total time        " << t.total << "  (the step time)\n";
    std::cout << "ideal (busiest)   " << t.ideal << "\n";
    std::cout << "bubble fraction   " << t.bubble_fraction << "  ((total - ideal) / total)\n";
    if (builtin && (schedule_name == "gpipe" || schedule_name == "1f1b" || schedule_name == "interleaved"))
      std::cout << "formula           " << formula_bubble_fraction(s.pp, s.micro_batches, s.virtual_stages)
                << "  ((p-1)/(v*m+p-1), equal stage costs, free p2p)\n";
    if (builtin)
      std::cout << "analytic          " << analytic_bubble_fraction(schedule_name, s.pp, s.micro_batches, s.virtual_stages)
                << "  (" << analytic_bubble_formula(schedule_name) << ", equal costs F = B = W per chunk, free p2p"
                << (schedule_name == "zb-h1" ? ", m >= p"
                    : schedule_name == "zbv" ? "; a lower bound, met e.g. for p = 2, 4, 8 and m = p, 2p, 3p"
                                             : "")
                << ")\n";
    std::cout << "\nrank  busy        idle        peak in-flight (micro-batch x chunk forwards whose "
              << (split ? "W" : "B") << " has not run)\n";
    for (int r = 0; r < s.pp; ++r)
      std::cout << std::setw(4) << r << "  " << std::setw(10) << t.busy[r] << "  " << std::setw(10)
                << t.total - t.busy[r] << "  " << t.peak_in_flight[r] << "\n";
    if (!svg_path.empty()) {
      std::ofstream f(svg_path, std::ios::binary);
      MPT_CHECK(static_cast<bool>(f), str("cannot write '", svg_path, "'"), "check the directory exists");
      f << timeline_svg(s, t);
      MPT_CHECK(static_cast<bool>(f), str("writing '", svg_path, "' failed"), "");
      std::cout << "\nwrote " << svg_path << "\n";
    }
    return 0;
  } catch (const po::error& e) {
    std::cerr << "schedule_sim: " << e.what() << "\n(see --help)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "schedule_sim: " << e.what() << "\n";
    return 1;
  }
}
