// The references a client's session holds on cached pages, with the key
// each page is cached under: a daemon restart drops them (its ledger keeps
// keys, not references), and the resume takes them again where the key is
// still cached on the same page (server/README.md "While hostkvd is away").
// Private to client/.
#ifndef HOSTKV_CLIENT_HELD_REFERENCES_H_
#define HOSTKV_CLIENT_HELD_REFERENCES_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "hostkv/client.h"

namespace hostkv {

struct HeldReference {
  std::string pool;
  uint64_t page = 0;
  std::string cache_namespace;
  std::string key;
  uint64_t count = 0;
};

// Thread-safe.
class HeldReferences {
 public:
  // One more reference on page pages[i], cached under keys[i].
  void Add(const std::string& pool, const std::string& cache_namespace,
           const std::vector<std::string>& keys,
           const std::vector<uint64_t>& pages) ABSL_LOCKS_EXCLUDED(mu_);
  // One fewer per page listed (a page listed twice, two).
  void Drop(const std::string& pool, const std::vector<PageRange>& pages)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Every reference held, forgotten here (a resume takes them again).
  std::vector<HeldReference> TakeAll() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Key = std::pair<std::string, uint64_t>;  // (pool, page)
  absl::Mutex mu_;
  std::map<Key, HeldReference> held_ ABSL_GUARDED_BY(mu_);
};

// The page numbers of runs, in order.
std::vector<uint64_t> PageList(const std::vector<PageRange>& runs);

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_HELD_REFERENCES_H_
