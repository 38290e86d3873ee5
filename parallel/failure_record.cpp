// parallel/failure_record.cpp — the host table, the phase, and the failure records.
#include "parallel/failure_record.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/fault_injection.h"
#include "parallel/job_exit.h"
#include "parallel/phase_watch.h"

namespace mpitron {

namespace {
std::mutex g_mu;
std::vector<std::string> g_hosts;  // by world rank
std::string g_phase = "setup", g_dir;
int64_t g_step = 0;
bool g_written = false;  // this process's record is written
std::vector<int> g_silent;

std::string own_host() {
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  int init = 0;
  MPI_Initialized(&init);
  if (init && MPI_Get_processor_name(name, &len) == MPI_SUCCESS && len > 0) return std::string(name, static_cast<size_t>(len));
  char buf[256] = {0};
  return gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("unknown");
}

int world_rank() {
  int init = 0, fin = 0, rank = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
}  // namespace

void install_host_table() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<char> mine(MPI_MAX_PROCESSOR_NAME, 0), all(static_cast<size_t>(n) * MPI_MAX_PROCESSOR_NAME, 0);
  const std::string h = own_host();
  h.copy(mine.data(), MPI_MAX_PROCESSOR_NAME - 1);
  {
    JobDeadline d("the all-gather of the ranks' host names at start-up", "a rank is frozen, hung or dead at start-up",
                  comm_timeout_from_env());
    MPI_Allgather(mine.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                  MPI_COMM_WORLD);
  }
  std::lock_guard<std::mutex> lock(g_mu);
  g_hosts.clear();
  for (int r = 0; r < n; ++r) g_hosts.emplace_back(all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
}

std::string host_of_rank(int world_rank_) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (world_rank_ < 0) return g_hosts.empty() ? own_host() : g_hosts[static_cast<size_t>(world_rank())];
  return world_rank_ < static_cast<int>(g_hosts.size()) ? g_hosts[static_cast<size_t>(world_rank_)] : std::string();
}

void enter_phase(const std::string& phase, int64_t step) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_phase = phase;
    g_step = step;
  }
  phase_heartbeat(phase, step);  // --ft-timeouts (parallel/phase_watch.h)
  fault_point(phase, step);
}

std::string job_phase() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_phase;
}

int64_t job_step() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_step;
}

void note_silent_ranks(const std::vector<int>& world_ranks) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_silent = world_ranks;
}

std::vector<int> noted_silent_ranks() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_silent;
}

void set_failure_record_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_dir = dir;
}

void write_failure_record(const FailureRecord& r) {
  try {
    std::string dir;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      const char* e = std::getenv("MPITRON_FAILURE_DIR");
      dir = e && *e ? std::string(e) : g_dir;
    }
    if (dir.empty()) return;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (g_written) return;
      g_written = true;
    }
    const int me = world_rank();
    nlohmann::ordered_json j;
    j["cause"] = r.cause;
    j["rank"] = r.rank;
    j["host"] = r.rank >= 0 ? host_of_rank(r.rank) : std::string();
    j["phase"] = job_phase();
    j["step"] = job_step();
    j["reporter"] = me;
    j["reporter_host"] = host_of_rank(-1);
    j["exit_code"] = r.exit_code;
    j["time"] = static_cast<int64_t>(std::time(nullptr));
    j["message"] = r.message;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string path = str(dir, "/rank-", me, ".json"), tmp = path + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) return;
    const std::string text = j.dump(1) + "\n";
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    std::fclose(f);
    if (ok) std::rename(tmp.c_str(), path.c_str());
  } catch (...) {  // a record is best effort: the job's own error still ends it
  }
}

}  // namespace mpitron
