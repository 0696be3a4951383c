// The op-call signatures a group has agreed on, most recently used first, bounded: a known
// signature votes without waiting for the other ranks, and a program that makes endless distinct
// calls (a new shape every step) does not grow the cache without limit.
#pragma once

#include <cstddef>
#include <list>
#include <string>
#include <unordered_map>

namespace interlace {

class SignatureCache {
 public:
  explicit SignatureCache(size_t capacity) : capacity_(capacity) {}

  // Whether `signature` is known; if so, it becomes the most recent.
  bool touch(const std::string& signature) {
    auto it = index_.find(signature);
    if (it == index_.end()) return false;
    order_.splice(order_.begin(), order_, it->second);
    return true;
  }

  // Adds a signature every rank agreed on, dropping the least recent past capacity.
  void add(const std::string& signature) {
    if (touch(signature)) return;
    order_.push_front(signature);
    index_[signature] = order_.begin();
    if (order_.size() > capacity_) {
      index_.erase(order_.back());
      order_.pop_back();
    }
  }

  size_t size() const { return order_.size(); }

 private:
  size_t capacity_;
  std::list<std::string> order_;
  std::unordered_map<std::string, std::list<std::string>::iterator> index_;
};

}  // namespace interlace
