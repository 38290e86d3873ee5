// tests/apps/http_client.h — a small blocking HTTP/1.1 client written here (POSIX sockets),
// so the server tests do not trust the library the server is built on: one connection,
// requests sent as given, answers read by Content-Length, chunked encoding, or to the close.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>

namespace http_test {

struct Reply {
  int status = 0;
  std::string headers, body;
  bool ok() const { return status == 200; }
};

class Connection {
 public:
  explicit Connection(int port, double timeout_s = 120) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) throw std::runtime_error("socket");
    timeval tv{static_cast<time_t>(timeout_s), 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect");
  }
  ~Connection() { close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Half-closes: no more bytes from us (as `nc -N` after its input ends); the answer can still arrive.
  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
  bool send_raw(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // One request (method, path, JSON body) on this connection; `extra` adds header lines.
  Reply request(const std::string& method, const std::string& path, const std::string& body,
                const std::string& extra = "") {
    send_raw(method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra +
             "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
    return read_reply();
  }
  // Whatever one recv() returns (buffered data first).
  std::string read_some() {
    if (buf_.empty()) fill();
    std::string s;
    s.swap(buf_);
    return s;
  }
  // Reads one answer. status 0: the connection closed before an answer.
  Reply read_reply() {
    Reply r;
    size_t he;
    while ((he = buf_.find("\r\n\r\n")) == std::string::npos)
      if (!fill()) return r;
    r.headers = buf_.substr(0, he);
    buf_.erase(0, he + 4);
    if (r.headers.rfind("HTTP/1.1 ", 0) != 0) return r;
    r.status = std::stoi(r.headers.substr(9, 3));
    const std::string lower = lowercase(r.headers);
    const size_t cl = lower.find("content-length:");
    if (lower.find("transfer-encoding: chunked") != std::string::npos) {
      for (;;) {
        size_t e;
        while ((e = buf_.find("\r\n")) == std::string::npos)
          if (!fill()) return r;
        const size_t n = std::stoul(buf_.substr(0, e), nullptr, 16);
        while (buf_.size() < e + 2 + n + 2)
          if (!fill()) return r;
        r.body += buf_.substr(e + 2, n);
        buf_.erase(0, e + 2 + n + 2);
        if (n == 0) break;
      }
    } else if (cl != std::string::npos) {
      const size_t n = std::stoul(r.headers.substr(cl + 15));
      while (buf_.size() < n)
        if (!fill()) break;
      r.body = buf_.substr(0, n);
      buf_.erase(0, std::min(n, buf_.size()));
    } else {
      while (fill()) {
      }
      r.body = buf_;
      buf_.clear();
    }
    return r;
  }

 private:
  static std::string lowercase(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  bool fill() {
    char b[8192];
    const ssize_t n = recv(fd_, b, sizeof b, 0);
    if (n <= 0) return false;
    buf_.append(b, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  std::string buf_;
};

// One request on a fresh connection.
inline Reply http(int port, const std::string& method, const std::string& path, const std::string& body) {
  Connection c(port);
  return c.request(method, path, body);
}
inline Reply http_raw(int port, const std::string& raw) {
  Connection c(port);
  c.send_raw(raw);
  return c.read_reply();
}

}  // namespace http_test
