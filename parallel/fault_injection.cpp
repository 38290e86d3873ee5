// parallel/fault_injection.cpp — MPITRON_FAULT: parsing and the faults.
#include "parallel/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace mpitron {

namespace {

struct Fault {
  std::string kind;
  int rank = -1;
  int64_t step = -1;
  std::string phase = "step";
  double factor = 2.0;
  int64_t attempt = -1;  // -1: every attempt
  std::string text;
};

const char* const kKinds[] = {"kill", "freeze", "hang", "slow", "nan", "flip"};
const char* const kPhases[] = {"setup", "step", "checkpoint-save", "checkpoint-load", "evaluation"};

[[noreturn]] void bad(const std::string& spec, const std::string& what) {
  MPT_THROW(str("MPITRON_FAULT=", spec, ": ", what),
            "write kind:rank=R:step=S[:phase=P][:factor=F][:attempt=A] with kind one of kill, freeze, hang, slow, nan, flip, "
            "faults separated by ';' (docs/training.md \"Fault injection\"), or unset it");
}

int64_t to_int(const std::string& spec, const std::string& key, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || x < 0) bad(spec, str(key, "=", v, " is not an integer >= 0"));
  return x;
}

std::vector<Fault> parse(const std::string& spec) {
  std::vector<Fault> out;
  std::stringstream all(spec);
  std::string one;
  while (std::getline(all, one, ';')) {
    if (one.empty()) continue;
    std::stringstream parts(one);
    std::string part;
    Fault f;
    f.text = one;
    std::getline(parts, f.kind, ':');
    bool known = false;
    for (const char* k : kKinds) known = known || f.kind == k;
    if (!known) bad(spec, str("unknown fault kind '", f.kind, "'"));
    bool has_rank = false, has_step = false;
    while (std::getline(parts, part, ':')) {
      const size_t eq = part.find('=');
      if (eq == std::string::npos) bad(spec, str("'", part, "' is not key=value"));
      const std::string key = part.substr(0, eq), v = part.substr(eq + 1);
      if (key == "rank") {
        f.rank = static_cast<int>(to_int(spec, key, v));
        has_rank = true;
      } else if (key == "step") {
        f.step = to_int(spec, key, v);
        has_step = true;
      } else if (key == "attempt") {
        f.attempt = to_int(spec, key, v);
      } else if (key == "factor") {
        char* end = nullptr;
        f.factor = std::strtod(v.c_str(), &end);
        if (v.empty() || *end || !std::isfinite(f.factor) || f.factor < 1) bad(spec, str("factor=", v, " is not a number >= 1"));
      } else if (key == "phase") {
        bool ok = false;
        for (const char* p : kPhases) ok = ok || v == p;
        if (!ok) bad(spec, str("phase=", v, " is not one of setup, step, checkpoint-save, checkpoint-load, evaluation"));
        f.phase = v;
      } else {
        bad(spec, str("unknown field '", key, "'"));
      }
    }
    if (!has_rank) bad(spec, str("'", one, "' names no rank="));
    if (!has_step && f.kind != "slow") bad(spec, str("'", one, "' names no step="));
    if (f.kind == "slow" && !has_step) f.step = 1;
    out.push_back(f);
  }
  return out;
}

struct Plan {
  std::vector<Fault> faults;  // this process's own (its rank, this attempt)
  std::set<int64_t> corrupted;  // steps already corrupted (a re-run runs clean)
};

std::mutex g_mu;

Plan& plan() {
  static Plan* p = [] {
    auto* out = new Plan();  // never destroyed: read from any thread until exit
    const char* spec = std::getenv("MPITRON_FAULT");
    if (!spec || !*spec) return out;
    const char* att = std::getenv("MPITRON_LAUNCH_ATTEMPT");
    const int64_t attempt = att && *att ? std::strtoll(att, nullptr, 10) : 0;
    const int rank = std::max(0, process_rank());
    for (const Fault& f : parse(spec))
      if (f.rank == rank && (f.attempt < 0 || f.attempt == attempt)) out->faults.push_back(f);
    return out;
  }();
  return *p;
}

}  // namespace

void check_fault_plan() { (void)plan(); }

void fault_point(const std::string& phase, int64_t step) {
  for (const Fault& f : plan().faults) {
    if (f.phase != phase || f.step != step) continue;
    if (f.kind == "kill" || f.kind == "freeze") {
      std::fprintf(stderr, "[rank %d] MPITRON_FAULT: %s at %s %lld (pid %d)\n", std::max(0, process_rank()),
                   f.text.c_str(), phase.c_str(), static_cast<long long>(step), static_cast<int>(getpid()));
      std::fflush(stderr);
      std::fflush(stdout);
      raise(f.kind == "kill" ? SIGKILL : SIGSTOP);
    }
    if (f.kind == "hang") {  // this thread stops for good; the process (its watchdog) lives on
      std::fprintf(stderr, "[rank %d] MPITRON_FAULT: %s at %s %lld: this thread hangs\n", std::max(0, process_rank()),
                   f.text.c_str(), phase.c_str(), static_cast<long long>(step));
      std::fflush(stderr);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(3600));
    }
  }
}

float StepCorruption::seed(float s) const {
  if (kind_ == kNan) return NAN;
  if (kind_ == kFlip) {
    uint32_t b = 0;
    std::memcpy(&b, &s, sizeof b);
    b ^= 1u << 30;  // the exponent's top bit
    std::memcpy(&s, &b, sizeof b);
  }
  return s;
}

double StepCorruption::loss(double l) const {
  if (kind_ == kNan) return NAN;
  if (kind_ == kFlip) {
    uint64_t b = 0;
    std::memcpy(&b, &l, sizeof b);
    b ^= uint64_t{1} << 62;
    std::memcpy(&l, &b, sizeof b);
  }
  return l;
}

StepCorruption take_step_corruption(int64_t step) {
  Plan& p = plan();
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Fault& f : p.faults) {
    if (f.step != step || (f.kind != "nan" && f.kind != "flip") || p.corrupted.count(step)) continue;
    p.corrupted.insert(step);
    log_warn("MPITRON_FAULT: ", f.text, ": this rank's loss and backward seed of step ", step, " are corrupted");
    return StepCorruption(f.kind == "nan" ? StepCorruption::kNan : StepCorruption::kFlip);
  }
  return StepCorruption();
}

void fault_slow_down(int64_t step, double compute_s) {
  for (const Fault& f : plan().faults)
    if (f.kind == "slow" && step >= f.step && compute_s > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>((f.factor - 1.0) * compute_s));
}

}  // namespace mpitron
