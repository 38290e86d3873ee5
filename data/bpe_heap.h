// data/bpe_heap.h — byte-level BPE merging of one pre-tokenized piece: a linked
// list of symbols and a min-heap of (rank, position) candidates, O(n log n).
// Lowest rank first, equal ranks left to right: the same result as rescanning
// for the best pair, since a pair created by a merge always ranks after that
// merge. Shared by the GPT-2 tokenizer (long pieces) and the Hugging Face
// tokenizer.json one (every piece).
#pragma once
#include <cstdint>
#include <functional>
#include <queue>
#include <string_view>
#include <vector>

namespace mpitron::data {

// byte_id: the token of each single byte. lookup(left, right, rank, merged)
// returns whether the pair merges, with its rank and the merged token.
template <class Lookup>
void bpe_merge_heap(std::string_view piece, const int32_t (&byte_id)[256], const Lookup& lookup,
                    std::vector<int32_t>& out) {
  const int64_t n = static_cast<int64_t>(piece.size());
  std::vector<int32_t> id(n);
  std::vector<int64_t> prev(n), next(n);
  for (int64_t i = 0; i < n; ++i) {
    id[i] = byte_id[static_cast<unsigned char>(piece[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    uint32_t rank;
    int64_t pos;
    int32_t left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int64_t i) {
    if (i < 0 || next[i] < 0) return;
    uint32_t rank = 0;
    int32_t merged = 0;
    if (lookup(id[i], id[next[i]], rank, merged)) heap.push(Cand{rank, i, id[i], id[next[i]], merged});
  };
  for (int64_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    // Stale entries: the left symbol was absorbed, or either side changed.
    if (id[c.pos] != c.left || next[c.pos] < 0 || id[next[c.pos]] != c.right) continue;
    const int64_t r = next[c.pos];
    id[c.pos] = c.merged;
    id[r] = -1;  // dead
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  for (int64_t i = 0; i >= 0 && n > 0; i = next[i]) out.push_back(id[i]);
}

}  // namespace mpitron::data
