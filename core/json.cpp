#include "core/json.h"

#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/files.h"

namespace mpitron {

namespace {
// The nesting of `text` without parsing it: brackets outside strings. Returns
// the 1-based line where `max_depth` is first exceeded, or 0.
int64_t line_past_depth(std::string_view text, int max_depth) {
  int depth = 0;
  int64_t line = 1;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (c == '\n') ++line;
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > max_depth) return line;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return 0;
}
}  // namespace

nlohmann::json parse_json_text(std::string_view text, const std::string& what, bool ignore_comments, int max_depth) {
  if (const int64_t line = line_past_depth(text, max_depth))
    MPT_THROW(str(what, " nests deeper than ", max_depth, " levels (line ", line, ")"),
              "no configuration or tokenizer file nests that deep: the file is damaged or not what it is named");
  // nlohmann keeps one of two equal keys of an object without a word: the second is refused,
  // naming the key and the objects around it ("zero_optimization.stage").
  struct Open {
    std::set<std::string> keys;
    std::string current;
  };
  std::vector<Open> open;
  const auto check_keys = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) {
      open.emplace_back();
    } else if (ev == E::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (ev == E::key && !open.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!open.back().keys.insert(key).second) {
        std::string path;
        for (size_t i = 0; i + 1 < open.size(); ++i) path += open[i].current + ".";
        MPT_THROW(str(what, " gives the key \"", path + key, "\" twice in one object"),
                  "JSON keeps only one of the two values: remove the one you did not mean");
      }
      open.back().current = key;
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), check_keys, true, ignore_comments);
  } catch (const nlohmann::json::exception& e) {
    MPT_THROW(str(what, " is not valid JSON: ", e.what()), "");
  }
}

nlohmann::json read_json_file(const std::string& path, const std::string& what, bool ignore_comments, int max_depth) {
  check_regular_file(path, what);  // a FIFO would block the open
  std::ifstream f(path, std::ios::binary);
  MPT_CHECK(f.good(), str("cannot open ", what, " '", path, "'"), "check the path");
  std::ostringstream ss;
  ss << f.rdbuf();
  MPT_CHECK(!f.bad(), str("cannot read ", what, " '", path, "'"), "");
  return parse_json_text(ss.str(), str(what, " '", path, "'"), ignore_comments, max_depth);
}

std::string json_excerpt(const nlohmann::json& v, size_t max_chars) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

}  // namespace mpitron
