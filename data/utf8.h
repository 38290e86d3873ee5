// data/utf8.h — decoding and encoding one UTF-8 code point (the BERT tokenizer and the
// sentence splitter walk text by character).
#pragma once
#include <string>
#include <string_view>

namespace mpitron::data {

// The code point of s at i, advancing i past it; an invalid or truncated sequence reads
// as one byte of U+FFFD.
inline char32_t next_cp(std::string_view s, size_t& i) {
  const unsigned c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  const int n = (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : 0;
  if (n == 0 || i + n >= s.size()) {
    ++i;
    return 0xFFFD;
  }
  char32_t cp = c & (0x3F >> n);
  for (int k = 1; k <= n; ++k) {
    const unsigned b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  i += n + 1;
  return cp;
}

// The code point before position i (moving i back to its first byte); i > 0.
inline char32_t prev_cp(std::string_view s, size_t& i) {
  size_t j = i - 1;
  while (j > 0 && i - j < 4 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
  size_t k = j;
  const char32_t c = next_cp(s, k);
  if (k != i) {  // not a whole character ending at i: one invalid byte
    i -= 1;
    return 0xFFFD;
  }
  i = j;
  return c;
}

inline void put_cp(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

}  // namespace mpitron::data
