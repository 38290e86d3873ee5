#include "io/http_server.h"

#include <errno.h>
#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>

#include "core/error.h"

// A client that half-closes its side after sending its request (shutdown(SHUT_WR), as `nc -N`
// and some proxies do) still gets its answer. Debian's compiled cpp-httplib 0.11 asks
// detail::is_socket_alive before every write, and that one peeks a byte and takes the end of the
// client's stream for a dead connection: the work was done and the answer dropped (0 bytes). The
// library calls it through its PLT, so this definition, linked into the executable, is the one it
// runs (ELF interposition; the header declares no such function, so nothing here conflicts with
// it): a socket is dead when it is invalid, in error or reset, not when the peer has only finished
// sending. A client that closed both sides makes a later write fail (EPIPE, ECONNRESET: the library
// sends with MSG_NOSIGNAL), which ends the connection as before. Tested end to end with a raw socket
// (tests/apps/test_http_half_close.cpp).
namespace httplib::detail {
bool is_socket_alive(int sock) {
  pollfd p{sock, POLLIN, 0};
  const int n = ::poll(&p, 1, 0);
  if (n == 0) return true;                     // nothing pending
  if (n < 0) return errno != EBADF;
  if (p.revents & (POLLERR | POLLNVAL)) return false;
  char c;
  const ssize_t r = ::recv(sock, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r >= 0) return true;                     // more bytes, or the peer's FIN: it may still read
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}
}  // namespace httplib::detail

namespace mpitron::io {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

const char* const kMethods[] = {"GET", "POST", "PUT", "DELETE", "PATCH"};

thread_local std::chrono::steady_clock::time_point t_request_start;

}  // namespace

std::string HttpRequest::header(const std::string& name) const {
  const std::string n = lower(name);
  for (const auto& [k, v] : headers)
    if (lower(k) == n) return v;
  return "";
}

struct HttpServer::Impl {
  httplib::Server svr;
  HttpLimits limits;
  struct Route {
    std::string method, path;
    HttpHandler handler;
  };
  std::vector<Route> routes;
  std::function<void(const std::string&)> log;
  std::function<void(const HttpServed&)> served;
  HttpErrorFormat error_format = [](int status, const std::string& message) {
    HttpResponse r;
    r.status = status;
    r.content_type = "text/plain";
    r.body = message + "\n";
    return r;
  };

  bool routed(const std::string& path) const {
    for (const Route& rt : routes)
      if (rt.path == path) return true;
    return false;
  }

  HttpResponse dispatch(const std::string& method, const httplib::Request& req) {
    HttpRequest r;
    r.method = method;
    r.path = req.path;
    r.body = req.body;
    for (const auto& [k, v] : req.headers) r.headers.emplace_back(k, v);
    std::string allow;
    for (const Route& rt : routes) {
      if (rt.path != req.path) continue;
      if (rt.method == method) {
        try {
          return rt.handler(r);
        } catch (const std::exception& e) {
          return error_format(500, e.what());
        }
      }
      allow += (allow.empty() ? "" : ", ") + rt.method;
    }
    if (allow.empty()) return error_format(404, str("not found: ", req.path));
    HttpResponse res = error_format(405, str("use ", allow, " ", req.path));
    res.headers.emplace_back("Allow", allow);
    return res;
  }

  void answer(const std::string& method, const httplib::Request& req, httplib::Response& res) {
    HttpResponse out = dispatch(method, req);
    res.status = out.status;
    for (const auto& [k, v] : out.headers) res.set_header(k, v);
    if (!out.stream) {
      res.set_content(out.body, out.content_type);
      return;
    }
    auto stream = std::move(out.stream);
    auto abort = std::move(out.abort);
    res.set_chunked_content_provider(
        out.content_type,
        [stream](size_t, httplib::DataSink& sink) {
          bool ok = true;
          const auto write = [&](const std::string& s) {
            ok = ok && sink.write(s.data(), s.size());
            return ok;
          };
          const bool more = stream(write);
          if (!ok) return false;  // the client is gone: the library closes the connection
          if (!more) sink.done();
          return true;
        },
        [abort](bool success) {
          if (!success && abort) abort();
        });
  }
};

HttpServer::HttpServer(const HttpLimits& limits) : impl_(std::make_unique<Impl>()) {
  MPT_CHECK(limits.threads >= 1, str("HTTP server: ", limits.threads, " connection threads"), "");
  impl_->limits = limits;
}

HttpServer::~HttpServer() {
  stop();
  join();
}

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler handler) {
  MPT_CHECK(std::find(std::begin(kMethods), std::end(kMethods), method) != std::end(kMethods),
            str("HTTP server: method ", method, " cannot be routed"), "");
  impl_->routes.push_back({method, path, std::move(handler)});
}

void HttpServer::on_response(std::function<void(const std::string& line)> log) { impl_->log = std::move(log); }
void HttpServer::on_served(std::function<void(const HttpServed&)> served) { impl_->served = std::move(served); }
void HttpServer::set_error_format(HttpErrorFormat format) { impl_->error_format = std::move(format); }

int HttpServer::start(const std::string& host, int port) {
  httplib::Server& s = impl_->svr;
  const HttpLimits& l = impl_->limits;
  const int threads = l.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  const auto split = [](double sec, time_t& whole, time_t& usec) {
    whole = static_cast<time_t>(std::floor(sec));
    usec = static_cast<time_t>((sec - std::floor(sec)) * 1e6);
  };
  time_t sec = 0, usec = 0;
  split(l.read_timeout_s, sec, usec);
  s.set_read_timeout(sec, usec);
  split(l.write_timeout_s, sec, usec);
  s.set_write_timeout(sec, usec);
  // The library waits keep_alive_timeout for EVERY request of a connection, the first
  // included: a client that connects and is slower than that to send its request (a loaded
  // machine: bench clients waited > 5 s) had its connection closed (reset at its write).
  // A new connection gets the read timeout to start, as an idle kept-alive one does.
  s.set_keep_alive_timeout(std::max<time_t>(1, static_cast<time_t>(std::ceil(std::max(l.keep_alive_s, l.read_timeout_s)))));
  s.set_keep_alive_max_count(l.keep_alive_max);
  s.set_payload_max_length(l.max_body);
  Impl* impl = impl_.get();
  for (const char* m : kMethods) {
    const std::string method = m;
    const auto h = [impl, method](const httplib::Request& req, httplib::Response& res) { impl->answer(method, req, res); };
    if (method == "GET") s.Get(".*", h);
    else if (method == "POST") s.Post(".*", h);
    else if (method == "PUT") s.Put(".*", h);
    else if (method == "DELETE") s.Delete(".*", h);
    else s.Patch(".*", h);
  }
  // The library's own refusals (malformed request, 413, unknown method) get a reason too;
  // ours keep their body.
  s.set_error_handler(httplib::Server::HandlerWithResponse([impl](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const char* why = res.status == 413   ? "request body too large"
                      : res.status == 400 ? "malformed HTTP request"
                                          : "request refused";
    const HttpResponse r = impl->error_format(res.status, str(why, " (", res.status, ")"));
    res.set_content(r.body, r.content_type);
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    t_request_start = std::chrono::steady_clock::now();
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_logger([impl](const httplib::Request& req, const httplib::Response& res) {
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_request_start).count();
    if (impl->served) impl->served({req.method, req.path, impl->routed(req.path), res.status, dt});
    if (!impl->log) return;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f s", dt);
    impl->log(str(req.method, " ", req.path, " ", res.status, " ", buf));
  });
  // The listening socket, to raise its backlog after the library's listen(): Debian's
  // compiled libcpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG is fixed
  // in the .so), and a burst of clients overflowed it: the kernel reset their connections
  // (seen: 32 clients starting together on the loaded 2-core machine, 128 on an idle one).
  // listen() again on a listening socket sets the new backlog (capped by somaxconn).
  int listen_fd = -1;
  s.set_socket_options([&listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = static_cast<int>(sock);  // the last socket tried is the one bound
  });
  const std::string h = host == "localhost" ? "127.0.0.1" : host;
  const int bound = port == 0 ? s.bind_to_any_port(h) : (s.bind_to_port(h, port) ? port : -1);
  MPT_CHECK(bound > 0, str("cannot listen on ", host, ":", port), "pick another --port (0: any free port) or --host");
  MPT_CHECK(listen_fd >= 0 && ::listen(listen_fd, 4096) == 0, str("cannot set the listen backlog on ", host, ":", bound),
            "");
  thread_ = std::thread([this] {
    impl_->svr.listen_after_bind();
    stopped_ = true;
  });
  return bound;
}

void HttpServer::stop() {
  if (thread_.joinable()) impl_->svr.stop();
}

void HttpServer::join() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace mpitron::io
