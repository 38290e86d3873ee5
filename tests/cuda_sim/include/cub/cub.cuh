// tests/cuda_sim/include/cub/cub.cuh — cub::DeviceRadixSort::SortPairs for the
// simulated device: a stable sort of (key, value) pairs by key bits [begin_bit, end_bit),
// the contract of CUB's LSD radix sort. Asks for 1 byte of temporary storage.
// Queued on its stream like a kernel (tests/cuda_sim/streams.cpp).
#pragma once
#include <algorithm>
#include <numeric>
#include <vector>

#include "cuda_runtime.h"

namespace cub {
struct DeviceRadixSort {
  template <typename K, typename V>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* vals_in,
                               V* vals_out, int n, int begin_bit = 0, int end_bit = sizeof(K) * 8,
                               cudaStream_t stream = nullptr, bool = false) {
    if (temp == nullptr) {
      temp_bytes = 1;
      return cudaSuccess;
    }
    if (temp_bytes < 1 || n < 0) return cudaErrorInvalidValue;
    const size_t nn = static_cast<size_t>(n);
    std::vector<::mpitron::cuda::sim::Access> acc = {
        {keys_in, nn * sizeof(K), false}, {vals_in, nn * sizeof(V), false}, {keys_out, nn * sizeof(K), true},
        {vals_out, nn * sizeof(V), true}, {temp, 1, true}};
    return ::mpitron::cuda::sim::enqueue(stream, "cub::DeviceRadixSort::SortPairs", std::move(acc), [=] {
      const auto bits = [&](K k) {
        const K mask = end_bit - begin_bit >= static_cast<int>(sizeof(K) * 8)
                           ? static_cast<K>(~K(0))
                           : static_cast<K>((K(1) << (end_bit - begin_bit)) - 1);
        return static_cast<K>((k >> begin_bit) & mask);
      };
      std::vector<int> order(nn);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return bits(keys_in[a]) < bits(keys_in[b]); });
      std::vector<K> k(nn);
      std::vector<V> v(nn);
      for (int i = 0; i < n; ++i) {
        k[i] = keys_in[order[i]];
        v[i] = vals_in[order[i]];
      }
      std::copy(k.begin(), k.end(), keys_out);
      std::copy(v.begin(), v.end(), vals_out);
    });
  }
};
}  // namespace cub
