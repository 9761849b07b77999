// Zeroing of freed pool pages before they are handed out again, off the
// request path: one background thread per pool.
#ifndef HOSTKV_SERVER_POOL_PAGE_SCRUBBER_H_
#define HOSTKV_SERVER_POOL_PAGE_SCRUBBER_H_

#include <cstdint>
#include <thread>

#include "kernels/pool_geometry.h"
#include "server/pool/slot_allocator.h"

namespace hostkv {

// Zeroes every byte of pages `run` of the pool at `base` laid out as `g`:
// every layer, K and V (or the MLA latent), wherever the layout puts them.
// REQUIRES: the run is inside the pool.
void ZeroPages(const PoolGeometry& g, uint8_t* base, const PageRun& run);

// Runs SlotAllocator::ScrubPending on its own thread, `batch_pages` pages at
// a time, until destroyed. The destructor stops and joins the thread (after
// the batch in progress); pages still waiting stay scrubbing (Allocate
// zeroes them itself if it needs them). Not copyable.
class PageScrubber {
 public:
  // REQUIRES: `allocator` was built with a ScrubFn and outlives this.
  PageScrubber(SlotAllocator* allocator, uint64_t batch_pages);
  ~PageScrubber();
  PageScrubber(const PageScrubber&) = delete;
  PageScrubber& operator=(const PageScrubber&) = delete;

  // Pages per batch so that one batch zeroes about `batch_bytes`.
  static uint64_t BatchPages(const PoolGeometry& g, uint64_t batch_bytes);

 private:
  SlotAllocator* const allocator_;
  std::thread thread_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_PAGE_SCRUBBER_H_
