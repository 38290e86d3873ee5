#include "model/inference/block_sharing.h"

#include <algorithm>
#include <unordered_set>

namespace mpitron {

namespace {

// Every sequence computes its own blocks.
class NoSharing final : public BlockSharing {
 public:
  const char* name() const override { return ""; }
  SharingCounters counters() const override { return {}; }
  void begin_step() override {}
  bool claim(SharingState&, const std::vector<int32_t>&, std::vector<int32_t>&, int64_t&) override { return true; }
  void unclaim(SharingState&, std::vector<int32_t>&, int64_t&) override {}
  void placed(SharingState&, const std::vector<int32_t>&, int64_t, int64_t, bool) override {}
  void computed(SharingState&, const std::vector<int32_t>&, const std::vector<int32_t>&, int64_t) override {}
  void dropped(SharingState&) override {}
};

class PrefixSharing final : public BlockSharing {
 public:
  PrefixSharing(PrefixEviction p, KVBlockAllocator& blocks, int64_t block_size)
      : policy_(p), blocks_(blocks), bs_(block_size) {}
  const char* name() const override { return row_of(policy_).name; }
  SharingCounters counters() const override { return n_; }
  void begin_step() override { filling_.clear(); }

  // The longest cached prefix of full blocks before the last token (whose block is always the
  // sequence's own and computed: its logits are needed, and a shared block is never written).
  bool claim(SharingState& st, const std::vector<int32_t>& tokens, std::vector<int32_t>& table,
             int64_t& cached) override {
    const int64_t known = static_cast<int64_t>(tokens.size());
    extend_block_keys(st.keys, tokens, known - 1, bs_);
    st.asked = (known - 1) / bs_;
    st.hit = blocks_.match(st.keys, st.asked);
    if (st.hit < st.asked && filling_.count(st.keys[static_cast<size_t>(st.hit)])) {
      ++n_.deferred;  // another row of this step computes it: share it next step instead
      return false;
    }
    blocks_.share(st.keys, st.hit, table);
    cached = st.hit * bs_;
    st.registered = st.hit;
    return true;
  }

  void unclaim(SharingState& st, std::vector<int32_t>& table, int64_t& cached) override {
    blocks_.release(table);
    cached = 0;
    st.registered = 0;
  }

  // Counts the claim; notes the blocks this step fills, so that a sequence planned after this one
  // waits for them instead of computing them again.
  void placed(SharingState& st, const std::vector<int32_t>& tokens, int64_t from, int64_t cached,
              bool claimed) override {
    if (claimed) {
      n_.queries += st.asked;
      n_.hits += st.hit;
      n_.tokens_saved += st.hit * bs_;
    }
    extend_block_keys(st.keys, tokens, cached, bs_);
    for (int64_t j = from / bs_; j < cached / bs_; ++j)
      if (!blocks_.cached(st.keys[static_cast<size_t>(j)])) filling_.insert(st.keys[static_cast<size_t>(j)]);
  }

  // The blocks whose every position is computed join the cache (a block whose prefix is already
  // cached under another block stays the sequence's own).
  void computed(SharingState& st, const std::vector<int32_t>& tokens, const std::vector<int32_t>& table,
                int64_t cached) override {
    const int64_t full = std::min<int64_t>(cached / bs_, static_cast<int64_t>(table.size()));
    extend_block_keys(st.keys, tokens, full * bs_, bs_);
    for (int64_t j = st.registered; j < full; ++j)
      blocks_.register_block(table[static_cast<size_t>(j)], st.keys[static_cast<size_t>(j)]);
    st.registered = std::max(st.registered, full);
  }

  void dropped(SharingState& st) override { st.registered = 0; }

 private:
  PrefixEviction policy_;
  KVBlockAllocator& blocks_;
  int64_t bs_;
  SharingCounters n_;
  std::unordered_set<uint64_t> filling_;  // keys of the blocks the step being planned completes
};

}  // namespace

std::unique_ptr<BlockSharing> make_block_sharing(const PrefixCacheOptions& o, KVBlockAllocator& blocks,
                                                 int64_t block_size) {
  if (!o.enabled) return std::make_unique<NoSharing>();
  return std::make_unique<PrefixSharing>(o.eviction, blocks, block_size);
}

}  // namespace mpitron
