// core/json.h — JSON that a user hands us (config.json, tokenizer.json, a
// DeepSpeed config, a JSONL line), parsed with bounds.
//
// nlohmann::json parses iteratively but dumps, compares and (in older
// versions) destroys recursively, so a file nested 100,000 deep crashes the
// process the first time an error message prints a value of it. Every parse
// of outside JSON therefore goes through parse_json_text, which first scans
// the text and refuses nesting deeper than kMaxJsonDepth with an Error that
// names the source and the line; error messages print values through
// json_excerpt, which bounds their length.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace mpitron {

// Deeper than any real config or tokenizer file (those nest < 10 levels).
constexpr int kMaxJsonDepth = 128;

// Parses `text`; `what` names the source in errors ("tokenizer 'a/tokenizer.json'").
// Throws an Error naming `what` and the line when the text is not JSON or nests
// deeper than max_depth. ignore_comments: accept // and /* */ comments (DeepSpeed configs).
nlohmann::json parse_json_text(std::string_view text, const std::string& what, bool ignore_comments = false,
                               int max_depth = kMaxJsonDepth);
// Reads and parses a regular file (what = "DeepSpeed config" gives "DeepSpeed config 'path'").
nlohmann::json read_json_file(const std::string& path, const std::string& what, bool ignore_comments = false,
                              int max_depth = kMaxJsonDepth);
// v.dump() cut to at most max_chars (with "…" when cut): for error messages.
std::string json_excerpt(const nlohmann::json& v, size_t max_chars = 200);

}  // namespace mpitron
