#ifndef MUONSHARD_WORKER_WORKLOAD_INTERNAL_COUNTER_RNG_H_
#define MUONSHARD_WORKER_WORKLOAD_INTERNAL_COUNTER_RNG_H_

// A counter-based generator for the workloads: the value at (key, index) is
// a pure function of the two, so any process, rank or thread computes the
// same number for the same element without shared state or sequencing.
// SplitMix64's finaliser mixes; FNV-1a hashes names. Uniform values use 24
// random bits, so they are exact floats and bit-identical everywhere.

#include <cstdint>
#include <initializer_list>

#include "absl/strings/string_view.h"

namespace muonshard::worker::internal {

// SplitMix64's output function (Steele, Lea, Flood 2014).
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a, 64 bits.
inline uint64_t HashName(absl::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// A key from several fields (order matters).
inline uint64_t MakeKey(std::initializer_list<uint64_t> fields) {
  uint64_t h = 0;
  for (uint64_t f : fields) h = Mix64(h ^ f);
  return h;
}

// Uniform in [-1, 1) at `index` of the stream `key`.
inline float UniformSigned(uint64_t key, uint64_t index) {
  const uint64_t bits = Mix64(key ^ Mix64(index)) >> 40;  // 24 bits
  return static_cast<float>(bits) * (1.0f / 8388608.0f) - 1.0f;
}

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_WORKLOAD_INTERNAL_COUNTER_RNG_H_
