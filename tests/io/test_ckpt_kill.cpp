// tests/io/test_ckpt_kill.cpp — crash safety of the checkpoint protocol with
// real processes: a 2-rank writer job saves checkpoints back to back and one
// of its ranks is SIGKILLed at a random instant; the directory must then hold
// an intact checkpoint (checksums verified) of the last committed iteration,
// with that iteration's data, and the next 2-rank run must resume from it and
// commit further checkpoints. Also: a flipped byte in the part of a dataset
// written by rank 1 of a 2-rank job is found by a serial reader, and both a
// serial and a 2-rank reader fall back to the previous checkpoint.
//
// This is a plain (non-MPI) test: it launches its writer jobs itself with
//   mpirun --allow-run-as-root --oversubscribe -np 2 <this binary> --test-case=ckpt_kill_writer
// and MPITRON_CKPT_KILL_DIR / _COUNT in the environment, which makes the
// "ckpt_kill_writer" case below act as the writer (it does nothing otherwise).
// Every wait has a timeout; each job runs in its own process group, which is
// SIGKILLed on the way out, and writers stop by themselves after 60 s.
// MPITRON_CKPT_KILL_SEED=<n> replays a run (the seed is printed).
// mpitron-test: timeout=120
// mpitron-test: label=reliability
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "io/checkpoint.h"
#include "tests/io/io_test_util.h"

extern char** environ;

using namespace mpitron;
using namespace mpitron::io;
using namespace mpitron::test;
namespace fs = std::filesystem;

namespace {

constexpr const char* kEnvDir = "MPITRON_CKPT_KILL_DIR";      // scratch dir: save/, progress.log, pid.<r>
constexpr const char* kEnvCount = "MPITRON_CKPT_KILL_COUNT";  // saves to make; 0 = until killed (or 60 s)

struct Spec {
  const char* name;
  Shape shape;
};
// ~5.3 MB of f32 per checkpoint; odd row counts give uneven row blocks.
const std::vector<Spec>& specs() {
  static const std::vector<Spec> s = {
      {"w0", {512, 512}}, {"layers/0/w1", {1024, 768}}, {"emb", {257, 300}}, {"b", {1001}}};
  return s;
}

// The global value of tensor k at iteration it: integers below 2^24, exact in f32.
Tensor expected(int64_t it, size_t k) {
  const Shape& shape = specs()[k].shape;
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) {
    uint64_t h = static_cast<uint64_t>(it) * 0x9E3779B97F4A7C15ull ^ (k + 1) * 0xC2B2AE3D27D4EB4Full ^ i;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    v[i] = static_cast<float>(h >> 40);
  }
  return Tensor::from_vector(v, shape, DType::F32);
}

std::pair<int64_t, int64_t> row_block(int64_t rows, int r, int n) { return {rows * r / n, rows * (r + 1) / n}; }

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One line appended with a single write() (O_APPEND), so a reader never sees
// half a line from a process that is still alive, and a killed process loses
// at most the line it had not written yet.
void append_line(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  const std::string s = line + "\n";
  (void)!::write(fd, s.data(), s.size());
  ::close(fd);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The progress log written by rank 0 of a writer job: "resumed L", "begin N", "commit N".
struct Progress {
  int64_t resumed = -1, last_begin = -1, last_commit = -1;
  int commits = 0;
};
Progress read_progress(const std::string& path) {
  Progress p;
  std::istringstream in(slurp(path));
  std::string word;
  int64_t n = 0;
  while (in >> word >> n) {
    if (word == "resumed") p.resumed = n;
    if (word == "begin") p.last_begin = n;
    if (word == "commit") {
      p.last_commit = n;
      ++p.commits;
    }
  }
  return p;
}

// A writer job: mpirun -np 2 of this binary in writer mode, in its own process group.
class WriterJob {
 public:
  WriterJob(const std::string& dir, int count, const std::string& log) : dir_(dir) {
    for (int r = 0; r < 2; ++r) fs::remove(fs::path(dir) / str("pid.", r));
    const std::string exe = fs::read_symlink("/proc/self/exe").string();
    // Everything exec needs is built before fork.
    std::vector<std::string> args = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "--mca", "btl",
                                     "self,vader,tcp", exe, "--test-case=ckpt_kill_writer", "--no-version=true"};
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string s = *e;
      if (s.rfind("OMPI_", 0) == 0 || s.rfind("PMIX_", 0) == 0 || s.rfind(kEnvDir, 0) == 0 ||
          s.rfind(kEnvCount, 0) == 0 || s.rfind("OMP_NUM_THREADS=", 0) == 0)
        continue;
      env.push_back(s);
    }
    env.push_back(str(kEnvDir, "=", dir));
    env.push_back(str(kEnvCount, "=", count));
    env.push_back("OMP_NUM_THREADS=1");
    env.push_back("OMPI_MCA_rmaps_base_oversubscribe=1");
    env.push_back("MPITRON_LOG_LEVEL=warn");
    std::vector<char*> argv, envp;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(out >= 0);
    std::fflush(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::dup2(out, 1);
      ::dup2(out, 2);
      ::execvpe("mpirun", argv.data(), envp.data());
      _exit(127);
    }
    ::setpgid(pid_, pid_);  // also here: no race with the child's own call
    ::close(out);
  }
  WriterJob(const WriterJob&) = delete;
  WriterJob& operator=(const WriterJob&) = delete;
  ~WriterJob() { kill_all(); }

  bool running() {
    if (pid_ < 0) return false;
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = st;
      pid_ = -1;
      return false;
    }
    return true;
  }
  // Waits up to timeout_s for mpirun to exit; false on timeout.
  bool wait(double timeout_s) {
    const double end = now_s() + timeout_s;
    while (running()) {
      if (now_s() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }
  bool exited_ok() const { return pid_ < 0 && WIFEXITED(status_) && WEXITSTATUS(status_) == 0; }

  // The pid of writer rank r, once it has written it (0 before).
  pid_t rank_pid(int r) const {
    std::ifstream in(fs::path(dir_) / str("pid.", r));
    long long p = 0;
    in >> p;
    return static_cast<pid_t>(p);
  }

  // SIGKILL to mpirun's process group and to any writer rank still alive; reaps mpirun.
  void kill_all() {
    if (pid_ > 0) ::kill(-pid_, SIGKILL);
    const std::string exe = fs::read_symlink("/proc/self/exe").string();
    for (int r = 0; r < 2; ++r) {
      const pid_t p = rank_pid(r);
      if (p <= 0 || p == ::getpid()) continue;
      // Only if that pid still runs this binary (no pid reuse accident).
      std::error_code ec;
      if (fs::read_symlink(str("/proc/", p, "/exe"), ec).string() == exe) ::kill(p, SIGKILL);
    }
    if (pid_ > 0) {
      int st = 0;
      ::waitpid(pid_, &st, 0);
      status_ = st;
      pid_ = -1;
    }
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  int status_ = -1;
};

// Waits until pred() or timeout; false on timeout.
template <typename Pred> bool wait_until(Pred pred, double timeout_s) {
  const double end = now_s() + timeout_s;
  while (!pred()) {
    if (now_s() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// The serial reader's view: the newest intact checkpoint must hold exactly the
// data of its iteration. Returns its iteration (0 when none).
int64_t check_latest_serial(const std::string& save) {
  CheckpointReader rd = CheckpointReader::open_latest(save, MPI_COMM_NULL, /*verify=*/true);
  if (!rd.found()) return 0;
  const int64_t it = rd.iteration();
  CHECK(rd.attr_int("step") == it);
  CHECK(rd.attr_int(kAttrWorldSize) == 2);
  for (size_t k = 0; k < specs().size(); ++k)
    CHECK_MESSAGE(same_bytes(rd.read(specs()[k].name), expected(it, k)), "tensor ", specs()[k].name,
                  " of iteration ", it);
  return it;
}

std::string tail_of(const std::string& path) {
  const std::string s = slurp(path);
  return s.size() > 3000 ? s.substr(s.size() - 3000) : s;
}

}  // namespace

// The writer, run by the jobs the tests below launch; a no-op otherwise.
// Resumes from the newest checkpoint (checking its data on every rank), then
// saves iterations L+1, L+2, ... with each rank writing a row block.
TEST_CASE("ckpt_kill_writer") {
  const char* dir_env = std::getenv(kEnvDir);
  if (!dir_env) return;
  REQUIRE(mpi_running());
  const std::string dir = dir_env, save = dir + "/save", log = dir + "/progress.log";
  const int count = std::atoi(std::getenv(kEnvCount) ? std::getenv(kEnvCount) : "0");
  const double deadline = now_s() + 60;  // never outlive a test that lost track of us
  const int r = world_rank(), n = world_size();
  {
    const std::string p = str(dir, "/pid.", r);
    std::ofstream(p + ".tmp") << ::getpid() << "\n";
    fs::rename(p + ".tmp", p);
  }
  int64_t resumed = 0;
  {
    CheckpointReader rd = CheckpointReader::open_latest(save, MPI_COMM_WORLD, /*verify=*/true);
    int bad = 0;
    if (rd.found()) {
      resumed = rd.iteration();
      bad |= rd.attr_int("step") != resumed;
      for (size_t k = 0; k < specs().size(); ++k) {
        const Shape& s = specs()[k].shape;
        auto [b, e] = row_block(s[0], r, n);
        if (b == e) continue;
        Shape off(s.size(), 0), cnt = s;
        off[0] = b;
        cnt[0] = e - b;
        bad |= !same_bytes(rd.read(specs()[k].name, off, cnt), expected(resumed, k).slice(0, b, e).contiguous());
      }
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    REQUIRE_MESSAGE(bad == 0, "resumed checkpoint ", resumed, " does not hold that iteration's data");
  }
  if (r == 0) append_line(log, str("resumed ", resumed));
  for (int64_t it = resumed + 1; count == 0 || it <= resumed + count; ++it) {
    int stop = now_s() > deadline;
    MPI_Bcast(&stop, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (stop) break;
    if (r == 0) append_line(log, str("begin ", it));
    CheckpointWriter w;
    w.begin(save, it, MPI_COMM_WORLD);
    for (size_t k = 0; k < specs().size(); ++k) {
      const Shape& s = specs()[k].shape;
      auto [b, e] = row_block(s[0], r, n);
      Shape off(s.size(), 0);
      off[0] = b;
      w.add_tensor(specs()[k].name, s, DType::F32, expected(it, k).slice(0, b, e).contiguous(), off);
    }
    w.set_attr_int("step", it);
    w.commit(/*keep_last=*/2);
    if (r == 0) append_line(log, str("commit ", it));
  }
}

TEST_CASE("checkpoint kill: SIGKILL of a writer rank mid-save keeps the last commit loadable; the next run resumes") {
  if (std::getenv(kEnvDir)) return;  // inside a writer job
  if (mpi_running()) {
    MESSAGE("skipped under mpirun: this test launches its own 2-rank mpirun jobs");
    return;
  }
  ScratchDir dir("ckpt_kill");
  const std::string save = dir / "save", log = dir / "progress.log";
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("MPITRON_CKPT_KILL_SEED")) seed = std::strtoull(s, nullptr, 10);
  std::printf("checkpoint kill test: seed %llu (MPITRON_CKPT_KILL_SEED=%llu replays it)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const int trials = 8;
  int64_t last = 0;  // the iteration the next run must resume from
  int after_rename = 0;
  const double t_start = now_s();
  for (int trial = 0; trial < trials; ++trial) {
    fs::remove(log);
    const std::string out = dir / str("mpirun.", trial, ".log");
    WriterJob job(dir.path(), 0, out);
    // Up and saving: both pids known and at least one commit of this run.
    const bool up = wait_until([&] { return !job.running() || (read_progress(log).commits >= 1 && job.rank_pid(0) > 0 &&
                                                               job.rank_pid(1) > 0); },
                               30);
    REQUIRE_MESSAGE(up, "trial ", trial, ": the writer job did not start saving within 30 s\n", tail_of(out));
    REQUIRE_MESSAGE(job.running(), "trial ", trial, ": the writer job exited early\n", tail_of(out));
    CHECK_MESSAGE(read_progress(log).resumed == last, "trial ", trial, ": the run resumed from ",
                  read_progress(log).resumed, ", expected ", last);
    // A random instant: the writers save back to back, so it falls inside some save.
    const int delay_ms = std::uniform_int_distribution<int>(0, 250)(rng);
    const int victim = std::uniform_int_distribution<int>(0, 1)(rng);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    REQUIRE(::kill(job.rank_pid(victim), SIGKILL) == 0);
    const bool ended = job.wait(20);  // mpirun notices the dead rank and aborts the other
    CHECK_MESSAGE(ended, "trial ", trial, ": mpirun did not end within 20 s of the kill (killed it)");
    job.kill_all();
    CHECK_FALSE(job.exited_ok());

    const Progress p = read_progress(log);
    const int64_t got = check_latest_serial(save);
    // The newest intact checkpoint is the last one whose commit returned, or
    // the one in flight when the kill came after its rename (commit step 5).
    CHECK_MESSAGE((got == p.last_commit || (got == p.last_begin && p.last_begin == p.last_commit + 1)),
                  "trial ", trial, ": loaded iteration ", got, "; last begun ", p.last_begin, ", last committed ",
                  p.last_commit);
    const int64_t tracker = CheckpointReader::read_tracker(save);
    CHECK_MESSAGE((tracker == got || tracker == got - 1), "tracker ", tracker, " vs loaded ", got);
    after_rename += got == p.last_begin;
    const bool tmp_left = fs::exists(fs::path(save) / (iteration_dir_name(p.last_begin) + ".tmp"));
    std::printf("  trial %d: killed rank %d after %3d ms, saves this run %d, in flight %lld, loaded %lld%s%s\n", trial,
                victim, delay_ms, p.commits, static_cast<long long>(p.last_begin), static_cast<long long>(got),
                got == p.last_begin ? " (killed after its rename)" : "", tmp_left ? ", .tmp left behind" : "");
    REQUIRE(got > last);
    last = got;
  }
  // The next run resumes from the survivor and commits two more, then exits cleanly.
  fs::remove(log);
  const std::string out = dir / "mpirun.final.log";
  WriterJob job(dir.path(), 2, out);
  const bool ended = job.wait(40);
  CHECK_MESSAGE(ended, "the resuming run did not finish within 40 s\n", tail_of(out));
  job.kill_all();
  CHECK_MESSAGE(job.exited_ok(), "the resuming run failed\n", tail_of(out));
  const Progress p = read_progress(log);
  CHECK(p.resumed == last);
  CHECK(p.last_commit == last + 2);
  CHECK(check_latest_serial(save) == last + 2);
  CHECK(CheckpointReader::read_tracker(save) == last + 2);
  std::printf("  resumed from %lld and committed %lld; %d of %d kills landed after the rename; %.1f s\n",
              static_cast<long long>(last), static_cast<long long>(last + 2), after_rename, trials,
              now_s() - t_start);
}

TEST_CASE("checkpoint kill: a flipped byte in rank 1's part of a 2-rank checkpoint is detected; load falls back") {
  if (std::getenv(kEnvDir)) return;
  if (mpi_running()) {
    MESSAGE("skipped under mpirun: this test launches its own 2-rank mpirun jobs");
    return;
  }
  ScratchDir dir("ckpt_kill_flip");
  const std::string save = dir / "save", log = dir / "progress.log";
  {
    WriterJob job(dir.path(), 2, dir / "mpirun.0.log");  // iterations 1 and 2
    CHECK_MESSAGE(job.wait(40), tail_of(dir / "mpirun.0.log"));
    job.kill_all();
    REQUIRE_MESSAGE(job.exited_ok(), tail_of(dir / "mpirun.0.log"));
  }
  REQUIRE(check_latest_serial(save) == 2);
  // Flip one byte in the last row of layers/0/w1: rank 1's row block.
  const std::string path = (fs::path(save) / iteration_dir_name(2) / kCheckpointFileName).string();
  const std::string name = specs()[1].name;
  {
    const int64_t off = Hdf5File::open(path).data_file_offset(name);
    REQUIRE(off > 0);
    const int64_t pos = off + shape_numel(specs()[1].shape) * 4 - 5;
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f);
    f.seekg(pos);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x01);
    f.seekp(pos);
    f.write(&c, 1);
  }
  std::string err;
  try {
    CheckpointReader::open_iteration(save, 2, MPI_COMM_NULL, /*verify=*/true);
  } catch (const Error& e) {
    err = e.what();
  }
  CHECK_MESSAGE(err.find(str("checksum mismatch in dataset '", name, "'")) != std::string::npos, err);
  CHECK(err.find(path) != std::string::npos);
  CHECK(check_latest_serial(save) == 1);  // serial reader falls back (tracker still says 2)
  // A 2-rank run falls back to 1 as well, then saves 2 again over the corrupt one.
  fs::remove(log);
  WriterJob job(dir.path(), 1, dir / "mpirun.1.log");
  CHECK_MESSAGE(job.wait(40), tail_of(dir / "mpirun.1.log"));
  job.kill_all();
  CHECK_MESSAGE(job.exited_ok(), tail_of(dir / "mpirun.1.log"));
  CHECK(read_progress(log).resumed == 1);
  CHECK(check_latest_serial(save) == 2);
}
