// io/checkpoint_group.h — the checkpoint layer's view of a communicator (internal).
//
// Every step of a checkpoint save or load that one rank may fail alone ends
// with an agreement: each rank's error text is gathered, and if any rank
// failed every rank throws the same error (plain Error, or CheckpointDamaged
// when some rank found damage). So no rank goes on to the next collective
// while another has left: a failure is one error on every rank, never a hang.
// MPI_COMM_NULL (or MPI not running) is one process.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "io/checkpoint.h"

namespace mpitron::io::detail {

// A communicator view that degrades to "one process" when MPI is not running.
struct Group {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  explicit Group(MPI_Comm c) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (c != MPI_COMM_NULL && init && !fin) {
      comm = c;
      MPI_Comm_rank(c, &rank);
      MPI_Comm_size(c, &size);
    }
  }
  bool mpi() const { return comm != MPI_COMM_NULL; }
  void barrier() const {
    if (mpi()) MPI_Barrier(comm);
  }
  // Every rank's non-empty error text, joined; the same string on all ranks.
  std::string gather_errors(const std::string& mine) const {
    if (!mpi()) return mine;
    const std::string tagged = mine.empty() || size == 1 ? mine : str("[rank ", rank, "] ", mine);
    int n = static_cast<int>(tagged.size());
    std::vector<int> lens(size), displs(size);
    MPI_Allgather(&n, 1, MPI_INT, lens.data(), 1, MPI_INT, comm);
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[r] = total;
      total += lens[r];
    }
    if (total == 0) return "";
    std::string all(static_cast<size_t>(total), '\0');
    MPI_Allgatherv(tagged.data(), n, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm);
    std::string out;
    for (int r = 0; r < size; ++r)
      if (lens[r]) out += (out.empty() ? "" : "\n  ") + all.substr(displs[r], lens[r]);
    return out;
  }
  // Runs fn on rank 0 only; its error (if any) is thrown on every rank.
  template <typename F> void on_root(const F& fn, const char* what) const {
    std::string err;
    if (rank == 0) {
      err = capture(fn);
    }
    rethrow_all(err, what);
  }
  // Runs fn on every rank; any rank's error is thrown on every rank.
  template <typename F> void on_all(const F& fn, const char* what) const {
    rethrow_all(capture(fn), what);
  }
  // fn's error text ("" when it succeeds): an mpitron::Error without its location prefix.
  template <typename F> static std::string capture(const F& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.hint().empty() ? e.message() : str(e.message(), " (hint: ", e.hint(), ")");
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
  void rethrow_all(const std::string& err, const char* what) const {
    const std::string all = gather_errors(err);
    if (!all.empty()) MPT_THROW(str(what, ": ", all), "");
  }
  // As capture/rethrow_all, remembering whether the error said "the checkpoint
  // is damaged" (CheckpointDamaged): if any rank's did, every rank throws
  // CheckpointDamaged, else a plain Error.
  struct Failure {
    std::string text;
    bool damaged = false;
  };
  template <typename F> static Failure capture_kind(const F& fn) {
    try {
      fn();
    } catch (const CheckpointDamaged& e) {
      return {e.hint().empty() ? e.message() : str(e.message(), " (hint: ", e.hint(), ")"), true};
    } catch (const Error& e) {
      return {e.hint().empty() ? e.message() : str(e.message(), " (hint: ", e.hint(), ")"), false};
    } catch (const std::exception& e) {
      return {e.what(), false};
    }
    return {};
  }
  void rethrow_kind(const Failure& f, const char* what) const {
    const std::string all = gather_errors(f.text);
    if (all.empty()) return;
    int damaged = f.damaged ? 1 : 0;
    if (mpi()) MPI_Allreduce(MPI_IN_PLACE, &damaged, 1, MPI_INT, MPI_MAX, comm);
    if (damaged) throw CheckpointDamaged(str(what, ": ", all), "", __FILE__, __LINE__);
    MPT_THROW(str(what, ": ", all), "");
  }
  // Rank 0's string on every rank.
  std::string bcast_string(const std::string& s) const {
    if (!mpi()) return s;
    uint64_t n = s.size();
    MPI_Bcast(&n, 1, MPI_UINT64_T, 0, comm);
    std::string out = rank == 0 ? s : std::string(static_cast<size_t>(n), '\0');
    if (n) MPI_Bcast(out.data(), static_cast<int>(n), MPI_CHAR, 0, comm);
    return out;
  }
};

}  // namespace mpitron::io::detail
