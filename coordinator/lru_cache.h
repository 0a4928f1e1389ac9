#ifndef MUONSHARD_COORDINATOR_LRU_CACHE_H_
#define MUONSHARD_COORDINATOR_LRU_CACHE_H_

// A thread-safe least-recently-used cache bounded by a byte budget. Values
// are immutable and shared: a caller keeps its shared_ptr however long it
// needs, whatever the cache evicts meanwhile.

#include <cstdint>
#include <list>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace muonshard::coordinator {

template <typename Key, typename Value>
class LruCache {
 public:
  explicit LruCache(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

  // The cached value, or nullptr.
  std::shared_ptr<const Value> Get(const Key& key) {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->value;
  }

  // Inserts (or replaces) `key`, evicting the least recently used entries
  // until the budget holds. A value larger than the whole budget is not kept.
  void Put(const Key& key, std::shared_ptr<const Value> value, int64_t bytes) {
    absl::MutexLock lock(&mu_);
    if (auto it = index_.find(key); it != index_.end()) Erase(it);
    if (bytes > capacity_bytes_) return;
    lru_.push_front(Entry{key, std::move(value), bytes});
    index_[key] = lru_.begin();
    used_bytes_ += bytes;
    while (used_bytes_ > capacity_bytes_) Erase(index_.find(lru_.back().key));
  }

  int64_t used_bytes() const {
    absl::MutexLock lock(&mu_);
    return used_bytes_;
  }

 private:
  struct Entry {
    Key key;
    std::shared_ptr<const Value> value;
    int64_t bytes;
  };
  using Iterator = typename std::list<Entry>::iterator;

  void Erase(typename absl::flat_hash_map<Key, Iterator>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    used_bytes_ -= it->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }

  const int64_t capacity_bytes_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<Key, Iterator> index_ ABSL_GUARDED_BY(mu_);
  int64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_LRU_CACHE_H_
