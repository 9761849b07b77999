// RequestHandler: the data-path requests: slots, transfers and page access.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/page_format.h"
#include "proto/contract/status_macros.h"
#include "server/pool/pool_access.h"
#include "server/pool/pool_spec.h"
#include "server/service/request_handler.h"
#include "server/service/request_validation.h"
#include "spdlog/spdlog.h"

namespace hostkv {

absl::StatusOr<v1::AllocResponse> RequestHandler::Alloc(
    const v1::AllocRequest& request) {
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_->Get(request.session_id()));
  ASSIGN_OR_RETURN(std::shared_ptr<HostPool> pool, pools_->Get(request.pool()));
  RETURN_IF_ERROR(CheckPoolUse(pool->name(), pool->owner(), Principal::Of(*session)));
  const uint32_t page_size = pool->geometry().page_size;
  if (request.num_tokens() == 0 || request.num_tokens() % page_size != 0) {
    if (metrics_ != nullptr) metrics_->RecordAllocFailure("bad_size");
    return absl::InvalidArgumentError(absl::StrCat(
        "num_tokens ", request.num_tokens(),
        " is not a positive multiple of the pool's page_size ", page_size));
  }
  if (request.fill_wait_ms() > 600000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fill_wait_ms ", request.fill_wait_ms(), " is over 600000 (10 minutes)"));
  }
  // A filling pool's pages not yet resident: wait for them, as the caller
  // chose (SlotAllocator::Allocate).
  const absl::Time fill_wait_until =
      request.fill_no_wait() ? absl::InfinitePast()
      : request.fill_wait_ms() > 0
          ? absl::Now() + absl::Milliseconds(request.fill_wait_ms())
          : absl::Now() + limits_.fill_wait;
  // Short of free pages, the pool's page cache gives up its coldest
  // unreferenced pages (none if they cannot make up the shortfall).
  PageCache& cache = pool->cache();
  absl::StatusOr<std::vector<PageRun>> allocated = pool->allocator().Allocate(
      request.num_tokens() / page_size, session->tag(),
      [&cache, number = static_cast<uint32_t>(session->tag())](uint64_t needed) {
        return cache.EvictForAllocation(needed, number);
      },
      fill_wait_until);
  if (!allocated.ok()) {
    if (metrics_ != nullptr) {
      metrics_->RecordAllocFailure(
          absl::IsFailedPrecondition(allocated.status()) ||
                  absl::IsDeadlineExceeded(allocated.status())
              ? "pool_filling"
              : "pool_full");
    }
    return allocated.status();
  }
  const std::vector<PageRun>& runs = *allocated;
  if (session->ending()) {  // ended meanwhile: its release may have run
    pool->allocator().FreeAllOwnedBy(session->tag());
    return absl::NotFoundError("the session ended during the request");
  }
  v1::AllocResponse response;
  response.mutable_pages()->Reserve(static_cast<int>(runs.size()));
  for (const PageRun& run : runs) {
    v1::PageRun* out = response.add_pages();
    out->set_first_page(run.first_page);
    out->set_num_pages(run.num_pages);
  }
  return response;
}

absl::StatusOr<RequestHandler::OwnedPages> RequestHandler::ResolveOwnedPages(
    const SessionId& session_id, const std::string& pool_name,
    const google::protobuf::RepeatedPtrField<v1::PageRun>& pages) {
  OwnedPages owned;
  ASSIGN_OR_RETURN(owned.session, sessions_->Get(session_id));
  ASSIGN_OR_RETURN(owned.pool, pools_->Get(pool_name));
  ASSIGN_OR_RETURN(owned.runs, ToPageRuns(pages));
  RETURN_IF_ERROR(
      owned.pool->allocator().CheckOwnedIdle(owned.runs, owned.session->tag()));
  return owned;
}

absl::StatusOr<v1::FreeResponse> RequestHandler::Free(
    const v1::FreeRequest& request) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_->Get(request.session_id()));
  ASSIGN_OR_RETURN(std::shared_ptr<HostPool> pool, pools_->Get(request.pool()));
  // Freeing nothing (e.g. every page of a publish was cached) is a no-op.
  if (request.pages_size() == 0) return v1::FreeResponse();
  ASSIGN_OR_RETURN(std::vector<PageRun> runs, ToPageRuns(request.pages()));
  ASSIGN_OR_RETURN(uint64_t freed, pool->allocator().Free(runs, session->tag()));
  v1::FreeResponse response;
  response.set_pages_freed(freed);
  return response;
}

absl::StatusOr<v1::HandOverPagesResponse> RequestHandler::HandOverPages(
    const v1::HandOverPagesRequest& request) {
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(std::shared_ptr<Session> from,
                   sessions_->Get(request.session_id()));
  ASSIGN_OR_RETURN(std::shared_ptr<Session> to,
                   sessions_->FindByNumber(request.to_session_number()));
  ASSIGN_OR_RETURN(std::shared_ptr<HostPool> pool, pools_->Get(request.pool()));
  // The receiver would read and write these pages: it must be allowed in
  // the pool itself.
  if (absl::Status s = CheckPoolUse(pool->name(), pool->owner(), Principal::Of(*to));
      !s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "session ", to->tag(), " may not receive pages of pool '", pool->name(),
        "': ", s.message()));
  }
  ASSIGN_OR_RETURN(std::vector<PageRun> runs, ToPageRuns(request.pages()));
  ASSIGN_OR_RETURN(const uint64_t pages,
                   pool->allocator().HandOver(runs, from->tag(), to->tag()));
  if (to->ending()) pool->allocator().FreeAllOwnedBy(to->tag());
  spdlog::info("session {} handed {} pages of pool '{}' to session {}",
               from->tag(), pages, pool->name(), to->tag());
  v1::HandOverPagesResponse response;
  response.set_pages(pages);
  return response;
}

absl::StatusOr<v1::TransferResponse> RequestHandler::Load(
    const v1::TransferRequest& request) {
  return Transfer(request, CopyDirection::kHostToDevice);
}

absl::StatusOr<v1::TransferResponse> RequestHandler::Backup(
    const v1::TransferRequest& request) {
  return Transfer(request, CopyDirection::kDeviceToHost);
}

absl::Status RequestHandler::CheckGpuTransfer(
    const v1::TransferRequest& request, const HostPool& pool,
    const DeviceImport& import, CopyDirection direction,
    CopyMechanism mechanism) const {
  GpuImportState* gpu = import.gpu();
  // Loads and backups alike: a backup waits for the KV to be written, a
  // load for the engine to stop reading the slots it overwrites.
  (void)direction;
  if (request.wait_kv_written() != 0 &&
      (gpu == nullptr || !gpu->has_signals())) {
    return absl::InvalidArgumentError(
        "wait_kv_written needs a CUDA import registered with gpu_signals");
  }
  if (request.wait_kv_written() > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wait_kv_written ", request.wait_kv_written(), " exceeds 2^63 - 1"));
  }
  // A client-picked signal value: checked against the import's last value
  // when the transfer engine enqueues it (in queue order).
  if (request.signal_value() != 0 && (gpu == nullptr || !gpu->has_signals())) {
    return absl::InvalidArgumentError(
        "signal_value needs a CUDA import registered with gpu_signals");
  }
  if (request.gpu_waits_only() && (gpu == nullptr || !gpu->has_signals())) {
    return absl::InvalidArgumentError(
        "gpu_waits_only needs a CUDA import registered with gpu_signals (the "
        "signal record is the only progress of other imports)");
  }
  if (request.signal_value() > kMaxSignalValue) {
    return absl::InvalidArgumentError(absl::StrCat(
        "signal_value ", request.signal_value(), " exceeds 2^63 - 1"));
  }
  if (gpu == nullptr) return absl::OkStatus();
  const PoolPinning::Progress pin = pool.pin_progress();
  if (pin.state == v1::PIN_PINNING) {
    return absl::UnavailableError(absl::StrCat(
        "pool '", pool.name(), "' is still being registered with CUDA (",
        pin.pinned_bytes * 100 / std::max<uint64_t>(pin.total_bytes, 1),
        "% done); its health entry turns SERVING when it is ready"));
  }
  if (pin.state != v1::PIN_PINNED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool '", pool.name(), "' could not be registered with CUDA: ",
        pin.error));
  }
  if (mechanism == CopyMechanism::kKernel &&
      pool.pinning()->device_base() == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool '", pool.name(), "' has no single device address range, so "
        "copy kernels cannot reach it; use MECHANISM_DIRECT"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::TransferResponse> RequestHandler::Transfer(
    const v1::TransferRequest& request, CopyDirection direction) {
  RETURN_IF_ERROR(CheckServing());
  // Ownership is checked by PinnedPages::Pin below, under the pool's lock.
  OwnedPages owned;
  ASSIGN_OR_RETURN(owned.session, sessions_->Get(request.session_id()));
  ASSIGN_OR_RETURN(owned.pool, pools_->Get(request.pool()));
  ASSIGN_OR_RETURN(owned.runs, TransferHostRuns(request));
  const PoolGeometry& g = owned.pool->geometry();
  ASSIGN_OR_RETURN(std::shared_ptr<DeviceImport> import,
                   owned.session->GetImport(request.import_id()));
  if (import->pool() != owned.pool) {
    return absl::InvalidArgumentError(absl::StrCat(
        "import ", request.import_id(), " was registered for pool '",
        import->pool()->name(), "', not '", owned.pool->name(), "'"));
  }
  ASSIGN_OR_RETURN(std::vector<SlotSpan> device,
                   TransferDeviceSpans(request, import->token_slots()));
  std::vector<SlotSpan> host = PagesToTokenSpans(owned.runs, g.page_size);
  uint64_t host_tokens = CountPages(owned.runs) * g.page_size;
  uint64_t device_tokens = 0;
  for (const SlotSpan& span : device) device_tokens += span.count;
  if (host_tokens != device_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host_pages cover ", host_tokens, " tokens but device_slots cover ",
        device_tokens));
  }
  RETURN_IF_ERROR(CheckNoOverlap(host, "host_pages"));
  if (direction == CopyDirection::kHostToDevice) {
    RETURN_IF_ERROR(CheckNoOverlap(device, "device_slots"));
  }
  const uint32_t layer_end =
      request.layer_end() == 0 ? g.num_layers : request.layer_end();
  if (request.layer_begin() >= layer_end || layer_end > g.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layers [", request.layer_begin(), ", ", layer_end,
        ") are not a non-empty range within the pool's ", g.num_layers,
        " layers"));
  }
  ASSIGN_OR_RETURN(CopyMechanism mechanism,
                   ResolveMechanism(request.mechanism(),
                                    owned.pool->info().spec().default_mechanism()));
  RETURN_IF_ERROR(CheckGpuTransfer(request, *owned.pool, *import, direction,
                                   mechanism));
  auto op = std::make_unique<TransferOp>();
  op->owner = owned.session->tag();
  op->wait_kv_written = request.wait_kv_written();
  op->signal_value = request.signal_value();  // 0: Submit picks one
  op->host_layer_progress =
      !request.gpu_waits_only() && !request.progress_at_end();
  // A load may read cached pages the session references; a backup writes
  // only pages the session owns.
  ASSIGN_OR_RETURN(op->host_pages,
                   direction == CopyDirection::kHostToDevice
                       ? PinnedPages::PinForRead(owned.pool, std::move(owned.runs),
                                                 owned.session->tag())
                       : PinnedPages::Pin(owned.pool, std::move(owned.runs),
                                          owned.session->tag()));
  op->op_id = owned.session->NextOpId();
  op->import = import;
  op->signals = owned.session->signals();
  op->layer_begin = request.layer_begin();
  op->layer_end = layer_end;
  op->submitted = absl::Now();
  op->task.geometry = g;
  op->task.host_base = owned.pool->base();
  op->task.layers = import->layers().data();
  op->task.runs = ZipRuns(host, device);
  op->task.IndexRuns();
  op->task.direction = direction;
  op->task.mechanism = mechanism;
  ASSIGN_OR_RETURN(op->signal_index, op->signals->Claim(op->op_id));
  v1::TransferResponse response;
  response.set_op_id(op->op_id);
  response.set_signal_index(op->signal_index);
  response.set_signal_segment_id(op->signals->id());
  response.set_layer_begin(op->layer_begin);
  response.set_num_layers(layer_end - op->layer_begin);
  response.set_num_tokens(host_tokens);
  response.set_bytes(host_tokens * g.kv_planes() * g.token_stride() *
                     response.num_layers());
  op->bytes = response.bytes();
  ASSIGN_OR_RETURN(const uint64_t signal_value,
                   transfers_->Submit(std::move(op)));
  response.set_signal_value(signal_value);
  return response;
}

absl::StatusOr<uint64_t> RequestHandler::CheckPageIoSize(const HostPool& pool,
                                                         uint64_t pages) const {
  const uint64_t page_bytes = pool.geometry().page_bytes();
  if (pages > limits_.max_page_io_bytes / page_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        pages, " pages of ", page_bytes, " bytes exceed the limit of ",
        limits_.max_page_io_bytes, " bytes per call; split the request"));
  }
  return pages * page_bytes;
}

absl::StatusOr<v1::ReadPagesResponse> RequestHandler::ReadPages(
    const v1::ReadPagesRequest& request) {
  // The session's pages with no copy in flight, or cached pages it
  // references; pinned while they are read.
  OwnedPages owned;
  ASSIGN_OR_RETURN(owned.session, sessions_->Get(request.session_id()));
  ASSIGN_OR_RETURN(owned.pool, pools_->Get(request.pool()));
  ASSIGN_OR_RETURN(owned.runs, ToPageRuns(request.pages()));
  ASSIGN_OR_RETURN(PinnedPages pinned,
                   PinnedPages::PinForRead(owned.pool, owned.runs,
                                           owned.session->tag(),
                                           /*owned_pages_idle=*/true));
  ASSIGN_OR_RETURN(uint64_t bytes,
                   CheckPageIoSize(*owned.pool, CountPages(owned.runs)));
  const PoolGeometry& g = owned.pool->geometry();
  v1::ReadPagesResponse response;
  std::string* data = response.mutable_data();
  data->resize(bytes);
  uint8_t* out = reinterpret_cast<uint8_t*>(data->data());
  for (const PageRun& run : owned.runs) {
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      CopyPageToFlat(g, owned.pool->base(), p, out);
      out += g.page_bytes();
    }
  }
  return response;
}

absl::StatusOr<v1::WritePagesResponse> RequestHandler::WritePages(
    const v1::WritePagesRequest& request) {
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(OwnedPages owned,
                   ResolveOwnedPages(request.session_id(), request.pool(),
                                     request.pages()));
  ASSIGN_OR_RETURN(uint64_t bytes,
                   CheckPageIoSize(*owned.pool, CountPages(owned.runs)));
  if (request.data().size() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data is ", request.data().size(), " bytes; ", CountPages(owned.runs),
        " pages need exactly ", bytes));
  }
  RETURN_IF_ERROR(CheckNoOverlap(PagesToTokenSpans(owned.runs, 1), "pages"));
  const PoolGeometry& g = owned.pool->geometry();
  const uint8_t* in = reinterpret_cast<const uint8_t*>(request.data().data());
  for (const PageRun& run : owned.runs) {
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      CopyFlatToPage(g, in, p, owned.pool->base());
      in += g.page_bytes();
    }
  }
  return v1::WritePagesResponse();
}

absl::StatusOr<v1::GetPageBufferMetaResponse> RequestHandler::GetPageBufferMeta(
    const v1::GetPageBufferMetaRequest& request) {
  ASSIGN_OR_RETURN(std::shared_ptr<HostPool> pool, pools_->Get(request.pool()));
  ASSIGN_OR_RETURN(std::vector<PageRun> runs, ToPageRuns(request.pages()));
  const PoolGeometry& g = pool->geometry();
  std::vector<BufferPiece> pieces;
  RETURN_IF_ERROR(CheckRunsInPool(runs, g.num_pages()));
  for (const PageRun& run : runs) {
    if (pieces.size() + run.num_pages * 2 * g.num_layers > kMaxRunsPerRequest) {
      return absl::InvalidArgumentError(
          "the request would list more than 2^20 pieces; split it");
    }
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      AppendPageBufferPieces(g, p, &pieces);
    }
  }
  v1::GetPageBufferMetaResponse response;
  response.set_segment_name(pool->info().segment_name());
  for (const BufferPiece& piece : pieces) {
    v1::BufferPiece* out = response.add_pieces();
    out->set_offset(piece.offset);
    out->set_size(piece.size);
  }
  return response;
}

}  // namespace hostkv
