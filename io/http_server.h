// io/http_server.h — an HTTP/1.1 server on cpp-httplib (Debian libcpp-httplib-dev), for
// text_generation_server. Only io/http_server.cpp includes the library.
//
// What it guarantees (each is a library setting or our routing, tested in
// tests/apps/test_server.cpp):
//   * concurrent connections: a pool of `threads` connection threads; a slow
//     client (a header trickling in byte by byte) or a vanished one occupies one
//     thread, never the others or the engine;
//   * keep-alive: up to keep_alive_max requests per connection, idle ones closed
//     after max(keep_alive_s, read_timeout_s) (a new connection has as long to start);
//   * limits: a body above max_body is refused with 413 before it is read; a
//     read or write that makes no progress for read_timeout_s / write_timeout_s
//     closes the connection; header lines are bounded by the library (8 KiB);
//   * routing: a registered (method, path) runs its handler; another method on a
//     known path is 405 with Allow, any other path 404; a handler that throws
//     gives 500 with the message; the server keeps serving after each.
// Streaming responses (server-sent events) are chunked: the handler returns a
// `stream` callback that the connection thread calls until it returns false;
// when a write fails (the client went away) `abort` is called instead.
#pragma once
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace mpitron::io {

struct HttpLimits {
  size_t max_body = 16u << 20;   // bytes; larger bodies get 413
  double read_timeout_s = 10;    // a read that waits longer closes the connection
  double write_timeout_s = 10;   // a write that waits longer closes the connection
  double keep_alive_s = 5;       // an idle connection (kept alive, or new) is closed after
                                 // max(this, read_timeout_s): the library has one wait for both
  size_t keep_alive_max = 100;   // requests per connection
  int threads = 128;             // connection threads (concurrent connections served)
};

struct HttpRequest {
  std::string method, path, body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string header(const std::string& name) const;  // case-insensitive; "" when absent
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // Streaming: called repeatedly; each call may block for the next piece and hands it to
  // `write` (which returns false when the client is gone). Return false when done.
  std::function<bool(const std::function<bool(const std::string&)>& write)> stream;
  std::function<void()> abort;  // called when a streaming write failed (e.g. cancel the work)
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;
// Formats the server's own refusals (404 unknown path, 405 other method, 500 a handler threw,
// 413 and 400 from the library): status and reason in, the answer out. Default: text/plain.
using HttpErrorFormat = std::function<HttpResponse(int status, const std::string& message)>;
// What on_served reports for each response.
struct HttpServed {
  std::string method, path;
  bool routed = false;  // the path is one of the routes (else a 404 for whatever path was asked)
  int status = 0;
  double seconds = 0;
};

class HttpServer {
 public:
  explicit HttpServer(const HttpLimits& limits);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Before start(). method: GET, POST, PUT, DELETE or PATCH.
  void route(const std::string& method, const std::string& path, HttpHandler handler);
  // Called after each response: "PUT /api 200 0.013 s".
  void on_response(std::function<void(const std::string& line)> log);
  // Called after each response with its parts (e.g. for metrics); from connection threads.
  void on_served(std::function<void(const HttpServed&)> served);
  void set_error_format(HttpErrorFormat format);
  // Binds host:port (0: a free port) and serves on background threads. Returns the port.
  int start(const std::string& host, int port);
  // Stops accepting; connections in progress finish on their threads. stopped() turns
  // true once every connection thread has returned.
  void stop();
  bool stopped() const { return stopped_; }
  void join();  // waits for stopped()

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
};

}  // namespace mpitron::io
