#include "client/held_references.h"

namespace hostkv {

void HeldReferences::Add(const std::string& pool,
                         const std::string& cache_namespace,
                         const std::vector<std::string>& keys,
                         const std::vector<uint64_t>& pages) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size() && i < pages.size(); ++i) {
    HeldReference& held = held_[{pool, pages[i]}];
    if (held.count == 0) held = {pool, pages[i], cache_namespace, keys[i], 0};
    ++held.count;
  }
}

void HeldReferences::Drop(const std::string& pool,
                          const std::vector<PageRange>& pages) {
  absl::MutexLock lock(&mu_);
  for (uint64_t page : PageList(pages)) {
    auto it = held_.find({pool, page});
    if (it == held_.end()) continue;
    if (--it->second.count == 0) held_.erase(it);
  }
}

std::vector<HeldReference> HeldReferences::TakeAll() {
  absl::MutexLock lock(&mu_);
  std::vector<HeldReference> all;
  all.reserve(held_.size());
  for (auto& [key, held] : held_) all.push_back(std::move(held));
  held_.clear();
  return all;
}

std::vector<uint64_t> PageList(const std::vector<PageRange>& runs) {
  std::vector<uint64_t> pages;
  for (const PageRange& run : runs) {
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      pages.push_back(p);
    }
  }
  return pages;
}

}  // namespace hostkv
