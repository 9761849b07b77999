// A test's read-only view of a pool's segment. Pool segments are sealed
// memfds that no name opens (hostkv.proto, Pool.segment_name): a test maps
// one as an engine does, through the session socket (kFetchPoolSegment).
#ifndef HOSTKV_TESTS_TESTING_POOL_SEGMENT_H_
#define HOSTKV_TESTS_TESTING_POOL_SEGMENT_H_

#include <unistd.h>

#include <string>

#include "absl/status/statusor.h"
#include "hostkv/client.h"
#include "proto/contract/shm_segment.h"

namespace hostkv::testing {

inline absl::StatusOr<ShmSegment> MapPoolSegment(Client& client,
                                                 const std::string& pool) {
  absl::StatusOr<Client::PoolSegment> fetched = client.FetchPoolSegment(pool);
  if (!fetched.ok()) return fetched.status();
  ScopedFd fd(fetched->fd);
  return ShmSegment::MapFd(fd.get(), "pool " + pool,
                           ShmSegment::Access::kReadOnly);
}

}  // namespace hostkv::testing

#endif  // HOSTKV_TESTS_TESTING_POOL_SEGMENT_H_
