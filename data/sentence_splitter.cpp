// data/sentence_splitter.cpp — the rules are listed in the header.
#include "data/sentence_splitter.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <string>

#include "data/utf8.h"

namespace mpitron::data {

namespace {

bool is_space(char32_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || (c >= 0x80 && u_isUWhiteSpace(c)); }
bool is_terminal(char32_t c) { return c == '.' || c == '!' || c == '?' || c == U'\u2026'; }
bool is_cjk_terminal(char32_t c) { return c == U'\u3002' || c == U'\uFF01' || c == U'\uFF1F'; }
bool is_closer(char32_t c) {
  return c == '"' || c == '\'' || c == ')' || c == ']' || c == '}' || c == U'\u201D' || c == U'\u2019' ||
         c == U'\u00BB' || c == U'\u300D' || c == U'\u300F' || c == U'\uFF09';
}
bool is_opener(char32_t c) {
  return c == '"' || c == '\'' || c == '(' || c == '[' || c == '{' || c == U'\u201C' || c == U'\u2018' ||
         c == U'\u00AB' || c == U'\u00BF' || c == U'\u00A1';
}
bool starts_sentence(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || is_opener(c);
  return is_opener(c) || u_isdigit(c) || (u_isalpha(c) && !u_islower(c));
}

const char* const kAbbreviations[] = {
    "Mr", "Mrs", "Ms", "Dr", "Prof", "Sr", "Jr", "St", "Mt", "Gen", "Col", "Lt", "Sgt", "Capt", "Cmdr", "Adm",
    "Rev", "Hon", "Gov", "Sen", "Rep", "Pres", "Fr", "Messrs", "Mme", "Mlle", "No", "Nos", "Vol", "Vols", "Fig",
    "Figs", "Eq", "Ch", "Sec", "Art", "Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov",
    "Dec", "vs", "v", "cf", "viz", "approx", "ca", "pp", "p", "al"};

// Is `word` (the text before a single '.', openers stripped) an abbreviation?
bool is_abbreviation(std::string_view word) {
  for (const char* a : kAbbreviations)
    if (word == a) return true;
  size_t i = 0;
  const char32_t first = word.empty() ? 0 : next_cp(word, i);
  if (i == word.size() && first && u_isupper(first)) return true;  // an initial
  // Letters with periods inside, each part 1-3 letters: U.S, e.g, Ph.D
  if (word.find('.') == std::string_view::npos) return false;
  int part = 0;
  for (i = 0; i < word.size();) {
    const char32_t c = next_cp(word, i);
    if (c == '.') {
      if (part == 0) return false;
      part = 0;
    } else if (u_isalpha(c) && ++part <= 3) {
    } else {
      return false;
    }
  }
  return part > 0;
}

}  // namespace

std::vector<std::string_view> split_sentences(std::string_view text, bool keep_newlines) {
  std::vector<std::string_view> out;
  const size_t n = text.size();
  auto skip_space = [&](size_t i) {
    while (i < n) {
      size_t j = i;
      if (!is_space(next_cp(text, j))) break;
      i = j;
    }
    return i;
  };
  auto trim_end = [&](size_t begin, size_t end) {
    while (end > begin) {
      size_t j = end;
      if (!is_space(prev_cp(text, j))) break;
      end = j;
    }
    return end;
  };
  size_t start = skip_space(0);
  size_t i = start;
  while (i < n) {
    const size_t mark = i;
    char32_t c = next_cp(text, i);
    const bool cjk = is_cjk_terminal(c);
    if (!cjk && !is_terminal(c)) continue;
    // The run of marks, then closing quotes / brackets.
    size_t run_end = i;
    int marks = 1;
    while (run_end < n) {
      size_t j = run_end;
      char32_t d = next_cp(text, j);
      if (!(is_terminal(d) || is_cjk_terminal(d))) break;
      run_end = j;
      ++marks;
    }
    size_t k = run_end;
    while (k < n) {
      size_t j = k;
      if (!is_closer(next_cp(text, j))) break;
      k = j;
    }
    i = k;
    const size_t next = skip_space(k);
    if (next >= n) break;  // only whitespace follows: the last sentence
    if (!cjk) {
      if (next == k) continue;  // no whitespace after the mark: 3.14, "a.b", "?!x"
      size_t j = next;
      if (!starts_sentence(next_cp(text, j))) continue;
      if (c == '.' && marks == 1) {
        // The word before the period, without leading openers.
        size_t w = mark;
        while (w > start) {
          size_t p = w;
          if (is_space(prev_cp(text, p))) break;
          w = p;
        }
        while (w < mark) {
          size_t p = w;
          if (!is_opener(next_cp(text, p))) break;
          w = p;
        }
        if (is_abbreviation(text.substr(w, mark - w))) continue;
      }
    }
    out.push_back(text.substr(start, (keep_newlines ? next : k) - start));
    start = next;
    i = next;
  }
  if (start < n) {
    const size_t end = keep_newlines ? n : trim_end(start, n);
    if (end > start) out.push_back(text.substr(start, end - start));
  }
  return out;
}

}  // namespace mpitron::data
