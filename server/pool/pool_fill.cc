#include "server/pool/pool_fill.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/pool/memory_budget.h"
#include "spdlog/spdlog.h"

namespace hostkv {

PoolFill::PoolFill(std::string pool, const PoolGeometry& g, uint8_t* base,
                   int reserve_fd, const PoolFillOptions& options,
                   ChunkReady ready, Done done)
    : pool_(std::move(pool)),
      geometry_(g),
      base_(base),
      reserve_fd_(reserve_fd),
      chunks_(PlanFillChunks(g.num_pages(), g.page_bytes(), options.chunk_bytes)),
      ready_(std::move(ready)),
      done_(std::move(done)),
      start_(absl::Now()),
      threads_(static_cast<unsigned>(std::max<size_t>(
          1, std::min<size_t>(std::max(1u, options.threads), chunks_.size())))),
      numa_node_(options.numa_node),
      sysfs_root_(options.sysfs_root) {
  {
    absl::MutexLock lock(&mu_);
    running_ = threads_;
  }
  workers_.reserve(threads_);
  for (unsigned t = 0; t < threads_; ++t) workers_.emplace_back([this] { Work(); });
}

PoolFill::~PoolFill() { Stop(); }

void PoolFill::Stop() {
  stop_.store(true);
  for (std::thread& w : workers_) {
    if (w.joinable() && w.get_id() != std::this_thread::get_id()) w.join();
  }
}

absl::Status PoolFill::FillChunk(const PageRun& chunk,
                                 ResidentMethod* method) const {
  for (const SegmentRange& range : FillChunkRanges(geometry_, chunk)) {
    ResidentMethod used = ResidentMethod::kPopulate;
    absl::Status s = MakeResident(base_, range, reserve_fd_, &used);
    if (!s.ok()) return s;
    if (used == ResidentMethod::kTouch) *method = used;
  }
  return absl::OkStatus();
}

void PoolFill::Work() {
  if (numa_node_ != kNoNode) {
    // The memory's policy is the segment's (mbind); this only keeps the
    // zeroing on the node's CPUs.
    absl::Status bound = BindThreadToNode(sysfs_root_, numa_node_);
    if (!bound.ok()) spdlog::warn("pool '{}': {}", pool_, std::string(bound.message()));
  }
  absl::Status status;
  for (;;) {
    if (stop_.load()) {
      status = absl::CancelledError("the pool was deleted while filling");
      break;
    }
    const size_t i = next_.fetch_add(1);
    if (i >= chunks_.size()) break;
    ResidentMethod method = ResidentMethod::kPopulate;
    status = FillChunk(chunks_[i], &method);
    if (!status.ok()) {
      stop_.store(true);  // the other threads stop after their chunk
      break;
    }
    if (method == ResidentMethod::kTouch) touched_.store(true);
    {
      // Counted first: whoever gets the pages from `ready_` then sees them
      // counted in progress().
      absl::MutexLock lock(&mu_);
      ready_pages_ += chunks_[i].num_pages;
    }
    if (ready_) ready_(chunks_[i]);
  }
  Finish(status);
}

void PoolFill::Finish(const absl::Status& status) {
  absl::Status result;
  absl::Duration elapsed;
  {
    absl::MutexLock lock(&mu_);
    // The first real error wins over the Cancelled of the threads it stopped.
    if (!status.ok() && (status_.ok() || (absl::IsCancelled(status_) &&
                                          !absl::IsCancelled(status)))) {
      status_ = status;
    }
    if (--running_ > 0) return;
    if (status_.ok() && ready_pages_ != geometry_.num_pages()) {
      status_ = absl::CancelledError("the pool was deleted while filling");
    }
    elapsed_ = absl::Now() - start_;
    elapsed = elapsed_;
    result = status_;
  }
  const double seconds = std::max(absl::ToDoubleSeconds(elapsed), 1e-9);
  if (result.ok()) {
    spdlog::info("pool '{}' resident: {} in {} chunks on {} threads in {} "
                 "({:.1f} GB/s{})",
                 pool_, FormatBytes(geometry_.total_bytes()), chunks_.size(),
                 threads_, absl::FormatDuration(elapsed),
                 static_cast<double>(geometry_.total_bytes()) / 1e9 / seconds,
                 touched_.load() ? ", user-space touch: the kernel lacks "
                                   "MADV_POPULATE_WRITE"
                                 : "");
  } else if (!absl::IsCancelled(result)) {
    spdlog::error("pool '{}': filling failed: {}", pool_, std::string(result.message()));
  }
  if (done_) done_(result);
  absl::MutexLock lock(&mu_);
  finished_ = true;
}

PoolFill::Progress PoolFill::progress() const {
  absl::MutexLock lock(&mu_);
  Progress p;
  p.total_pages = geometry_.num_pages();
  p.ready_pages = ready_pages_;
  p.threads = threads_;
  p.method = touched_.load() ? ResidentMethod::kTouch : ResidentMethod::kPopulate;
  if (!finished_) {
    // Every page handed over: ready, though the threads are still ending.
    p.state = ready_pages_ == p.total_pages ? v1::FILL_READY : v1::FILL_FILLING;
    p.elapsed = absl::Now() - start_;
  } else {
    p.state = status_.ok() ? v1::FILL_READY : v1::FILL_FAILED;
    p.elapsed = elapsed_;
    p.error = std::string(status_.message());
  }
  return p;
}

absl::Status PoolFill::Wait() const {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&finished_));
  return status_;
}

PoolFill::Progress AdoptedFillProgress(uint64_t num_pages) {
  PoolFill::Progress p;
  p.state = v1::FILL_READY;
  p.ready_pages = p.total_pages = num_pages;
  return p;
}

}  // namespace hostkv
