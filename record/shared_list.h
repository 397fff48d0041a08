// A list that equal copies share: the params of data-parallel replicas, in run records and in
// manifests, are held once however large the world. Read like a const vector; copy on write.
#pragma once

#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

namespace tally::record {

template <class T>
class SharedList {
 public:
  SharedList() : list_(std::make_shared<std::vector<T>>()) {}
  SharedList(std::vector<T> items)  // NOLINT: a vector is a list
      : list_(std::make_shared<std::vector<T>>(std::move(items))) {}
  SharedList(std::initializer_list<T> items) : SharedList(std::vector<T>(items)) {}

  std::size_t size() const { return list_->size(); }
  bool empty() const { return list_->empty(); }
  const T& operator[](std::size_t i) const { return (*list_)[i]; }
  typename std::vector<T>::const_iterator begin() const { return list_->begin(); }
  typename std::vector<T>::const_iterator end() const { return list_->end(); }
  const std::vector<T>& list() const { return *list_; }
  // Lists of one identity are one list (memos and pools key on it).
  const void* identity() const { return list_.get(); }

  // The list for changing, copied first when another value shares it.
  std::vector<T>& edit() {
    if (list_.use_count() != 1) list_ = std::make_shared<std::vector<T>>(*list_);
    return *list_;
  }

  friend bool operator==(const SharedList& a, const SharedList& b) {
    return a.list_ == b.list_ || *a.list_ == *b.list_;
  }

 private:
  std::shared_ptr<std::vector<T>> list_;
};

}  // namespace tally::record
