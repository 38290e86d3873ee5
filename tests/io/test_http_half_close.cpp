// A client that half-closes its side right after sending its request (shutdown(SHUT_WR), as
// `nc -N` does) gets the whole answer (issue 47, item 7): a plain body and a streamed (chunked)
// one, after the handler has done its work. io/http_server.cpp; a raw socket client
// (tests/apps/http_client.h), not the library the server is built on.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "io/http_server.h"
#include "tests/apps/http_client.h"

using namespace mpitron;

namespace {

struct Server {
  io::HttpServer http{io::HttpLimits{}};
  std::atomic<int> done{0};
  int port = 0;
  Server() {
    http.route("PUT", "/api", [this](const io::HttpRequest& req) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the work, after the client's FIN arrived
      ++done;
      io::HttpResponse r;
      r.body = "{\"echo\": " + req.body + "}";
      return r;
    });
    http.route("POST", "/stream", [this](const io::HttpRequest&) {
      io::HttpResponse r;
      r.content_type = "text/event-stream";
      auto n = std::make_shared<int>(0);
      r.stream = [this, n](const std::function<bool(const std::string&)>& write) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (!write("data: " + std::to_string(*n) + "\n\n")) return false;
        if (++*n < 3) return true;
        ++done;
        return false;
      };
      return r;
    });
    port = http.start("127.0.0.1", 0);
  }
};

http_test::Reply half_closed(int port, const std::string& method, const std::string& path, const std::string& body) {
  http_test::Connection c(port, 30);
  REQUIRE(c.send_raw(method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                     "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body));
  c.shutdown_write();
  return c.read_reply();
}

}  // namespace

TEST_CASE("a client that half-closes after its request gets the whole answer") {
  Server s;
  const http_test::Reply r = half_closed(s.port, "PUT", "/api", "[1, 2]");
  CHECK(s.done == 1);  // the work was done ...
  CHECK_MESSAGE(r.status == 200, "status ", r.status, " headers '", r.headers, "'");  // ... and the answer arrived
  CHECK(r.body == "{\"echo\": [1, 2]}");
}

TEST_CASE("a half-closed client gets a streamed answer to its end") {
  Server s;
  const http_test::Reply r = half_closed(s.port, "POST", "/stream", "{}");
  CHECK_MESSAGE(r.status == 200, "status ", r.status, " headers '", r.headers, "'");
  CHECK(r.body == "data: 0\n\ndata: 1\n\ndata: 2\n\n");
  CHECK(s.done == 1);
}

TEST_CASE("after half-closed and vanished clients the server still answers") {
  Server s;
  for (int i = 0; i < 3; ++i) CHECK(half_closed(s.port, "PUT", "/api", std::to_string(i)).status == 200);
  {  // a client that sends and closes both sides at once: nothing to answer to, nothing breaks
    http_test::Connection c(s.port, 30);
    c.send_raw("PUT /api HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n7");
    c.close();
  }
  const http_test::Reply r = http_test::http(s.port, "PUT", "/api", "5");
  CHECK(r.status == 200);
  CHECK(r.body == "{\"echo\": 5}");
}
