// core/error.h — errors that say what failed, where, on which rank, and what to do.
//
// Library code throws mpitron::Error; only a main() decides to exit. Build one
// with MPT_THROW / MPT_CHECK, which record file:line and the process rank.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace mpitron {

// Process rank for error and log prefixes; -1 until MPI (or a launcher) tells us.
int process_rank();
void set_process_rank(int rank);

// Concatenate anything streamable: str("n=", n, " bytes").
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

class Error : public std::runtime_error {
 public:
  Error(std::string what, std::string hint, const char* file, int line);
  const std::string& message() const { return message_; }  // without location
  const std::string& hint() const { return hint_; }
  const char* file() const { return file_; }
  int line() const { return line_; }
  int rank() const { return rank_; }

 private:
  std::string message_, hint_;
  const char* file_;
  int line_, rank_;
};

}  // namespace mpitron

// MPT_THROW(what, hint): hint says what the user can do ("" when nothing).
#define MPT_THROW(what, hint) throw ::mpitron::Error((what), (hint), __FILE__, __LINE__)
// MPT_CHECK(cond, what[, hint]): throws when cond is false.
#define MPT_CHECK(cond, ...)                                                              \
  do {                                                                                    \
    if (!(cond)) ::mpitron::detail::check_failed(#cond, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

namespace mpitron::detail {
[[noreturn]] void check_failed(const char* cond, const char* file, int line, const std::string& what,
                               const std::string& hint = "");
}  // namespace mpitron::detail
