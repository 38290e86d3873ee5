// model/inference/block_sharing.h — how the dynamic engine's sequences come by KV blocks they do
// not compute. Two implementations, chosen once from EngineConfig::prefix_caching:
//   none            every sequence computes and holds its own blocks (the engine as before);
//   prefix caching  (--inference-dynamic-batching-prefix-caching, prefix_cache.h) a sequence
//                   without blocks starts with the cached full blocks of its longest cached prefix
//                   (before its last token, whose logits it needs); blocks join the cache after the
//                   step that computes their last position; a sequence whose next block another
//                   sequence of the step being planned fills waits one step and shares it then.
// The engine calls every hook whatever the implementation and never asks which it has. It runs on
// the driver: the block tables it makes travel in the step plans, so every TP and PP rank's cache
// shares the same blocks.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/inference/kv_block_allocator.h"
#include "model/inference/prefix_cache.h"

namespace mpitron {

// Per sequence (the engine's Seq holds one).
struct SharingState {
  std::vector<uint64_t> keys;  // prefix keys of its full blocks (prefix_cache.h), as far as computed
  int64_t registered = 0;      // its first `registered` blocks are shared or were offered to the cache
  int64_t asked = 0, hit = 0;  // the last claim: blocks looked up, blocks found
};

struct SharingCounters {
  int64_t queries = 0;       // full prompt blocks looked up by the claims that got into a step
  int64_t hits = 0;          // of them found cached (neither computed nor allocated)
  int64_t tokens_saved = 0;  // hits x block size
  int64_t deferred = 0;      // claims put off a step to share a block that step fills
};

class BlockSharing {
 public:
  virtual ~BlockSharing() = default;
  virtual const char* name() const = 0;  // the eviction policy's name; "" without sharing
  virtual SharingCounters counters() const = 0;
  // The planning of a step begins.
  virtual void begin_step() = 0;
  // A sequence that holds no blocks (table empty, cached 0) is about to be planned: appends the
  // blocks it shares to `table`, sets `cached` to the positions they hold. False: it waits a step.
  virtual bool claim(SharingState& st, const std::vector<int32_t>& tokens, std::vector<int32_t>& table,
                     int64_t& cached) = 0;
  // The claiming sequence did not get into the step: what it shares goes back (table empty, cached 0).
  virtual void unclaim(SharingState& st, std::vector<int32_t>& table, int64_t& cached) = 0;
  // A sequence got positions [from, cached) into the step (`claimed`: right after its claim).
  virtual void placed(SharingState& st, const std::vector<int32_t>& tokens, int64_t from, int64_t cached,
                      bool claimed) = 0;
  // After the step ran: positions [0, cached) of the sequence are computed.
  virtual void computed(SharingState& st, const std::vector<int32_t>& tokens, const std::vector<int32_t>& table,
                        int64_t cached) = 0;
  // Its blocks were released (the sequence was evicted; it claims again when it comes back).
  virtual void dropped(SharingState& st) = 0;
};

// `blocks` must outlive the result.
std::unique_ptr<BlockSharing> make_block_sharing(const PrefixCacheOptions& o, KVBlockAllocator& blocks,
                                                 int64_t block_size);

}  // namespace mpitron
