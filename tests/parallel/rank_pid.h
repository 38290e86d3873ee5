// tests/parallel/rank_pid.h — the process of one world rank of an mpirun job started by a test
// (to freeze it with SIGSTOP, as a hung GPU or a stuck node looks to the other ranks).
#pragma once
#include <sys/types.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace mpitron_test {

// The pid of world rank `rank` among the processes whose ancestor is `root`
// (mpirun forks the local ranks), from /proc; -1 when not found.
inline pid_t rank_pid(pid_t root, int rank) {
  const auto parent_of = [](pid_t p) -> pid_t {
    std::ifstream f("/proc/" + std::to_string(p) + "/stat");
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t close = s.rfind(')');
    if (close == std::string::npos) return -1;
    std::istringstream in(s.substr(close + 2));
    char state;
    pid_t ppid = -1;
    in >> state >> ppid;
    return ppid;
  };
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t p = std::stoi(name);
    bool under = false;
    for (pid_t q = parent_of(p); q > 1; q = parent_of(q))
      if (q == root) {
        under = true;
        break;
      }
    if (!under) continue;
    std::ifstream env("/proc/" + name + "/environ", std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    if (all.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(rank) + '\0') != std::string::npos) return p;
  }
  return -1;
}

}  // namespace mpitron_test
