#include "server/service/ring_call.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "proto/contract/command_ring.h"

namespace hostkv {
namespace {

// The most bytes one encoded PageRun takes in a repeated field (two
// varints of up to 10 bytes, their tags, the field's tag and length).
constexpr uint64_t kRunBytes = 24;
// A response's scalar fields, with room to spare (TransferResponse has
// the most).
constexpr uint64_t kScalarBytes = 1024;

RingAnswer Refused(const absl::Status& status) {
  return RingAnswer{static_cast<uint32_t>(status.code()),
                    std::string(status.message())};
}

template <typename Response>
RingAnswer Answer(const absl::StatusOr<Response>& result) {
  if (!result.ok()) return Refused(result.status());
  RingAnswer out;
  out.code = 0;
  result->SerializeToString(&out.answer);
  return out;
}

// The most bytes `method`'s answer to `request` can take; 0 if the request
// names no pool we know (the handler then refuses it, briefly).
uint64_t AllocAnswerBound(const PoolRegistry& pools,
                          const v1::AllocRequest& request) {
  absl::StatusOr<std::shared_ptr<HostPool>> pool = pools.Get(request.pool());
  if (!pool.ok()) return kScalarBytes;
  const uint64_t page_size = (*pool)->geometry().page_size;
  if (page_size == 0) return kScalarBytes;
  // No more runs than pages asked for, nor than the pool has.
  const uint64_t pages = std::min(request.num_tokens() / page_size + 1,
                                  (*pool)->allocator().num_pages());
  return kScalarBytes + pages * kRunBytes;
}

template <typename Request>
Request* Parse(google::protobuf::Arena& arena, absl::string_view bytes,
               const std::string& session_id) {
  auto* request = google::protobuf::Arena::CreateMessage<Request>(&arena);
  if (!request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return nullptr;
  }
  request->set_session_id(session_id);
  return request;
}

RingAnswer Unparsable(uint32_t method) {
  return Refused(absl::InvalidArgumentError(absl::StrCat(
      "the command ring's request is not a valid ", RingMethodName(method),
      " request")));
}

RingAnswer TooLarge(uint64_t bound, uint64_t capacity) {
  return RingAnswer{kRingUseGrpc,
                    absl::StrCat("the answer could take ", bound,
                                 " bytes; a ring slot holds ", capacity)};
}

}  // namespace

const char* RingMethodName(uint32_t method) {
  switch (static_cast<RingMethod>(method)) {
    case RingMethod::kAlloc:
      return "Alloc";
    case RingMethod::kFree:
      return "Free";
    case RingMethod::kLoad:
      return "Load";
    case RingMethod::kBackup:
      return "Backup";
    case RingMethod::kLookup:
      return "Lookup";
    case RingMethod::kRelease:
      return "Release";
    case RingMethod::kPublish:
      return "Publish";
    case RingMethod::kListEvictions:
      return "ListEvictions";
  }
  return nullptr;
}

RingAnswer RunRingCall(RequestHandler& handler, const PoolRegistry& pools,
                       const std::string& session_id, uint32_t method,
                       absl::string_view request, absl::Time deadline,
                       uint64_t answer_capacity) {
  if (RingMethodName(method) == nullptr) {
    return Refused(absl::InvalidArgumentError(
        absl::StrCat("unknown command ring method ", method)));
  }
  google::protobuf::Arena arena;
  switch (static_cast<RingMethod>(method)) {
    case RingMethod::kAlloc: {
      auto* r = Parse<v1::AllocRequest>(arena, request, session_id);
      if (r == nullptr) return Unparsable(method);
      const uint64_t bound = AllocAnswerBound(pools, *r);
      if (bound > answer_capacity) return TooLarge(bound, answer_capacity);
      return Answer(handler.Alloc(*r));
    }
    case RingMethod::kFree: {
      auto* r = Parse<v1::FreeRequest>(arena, request, session_id);
      if (r == nullptr) return Unparsable(method);
      return Answer(handler.Free(*r));
    }
    case RingMethod::kLoad:
    case RingMethod::kBackup: {
      auto* r = Parse<v1::TransferRequest>(arena, request, session_id);
      if (r == nullptr) return Unparsable(method);
      return Answer(static_cast<RingMethod>(method) == RingMethod::kLoad
                        ? handler.Load(*r)
                        : handler.Backup(*r));
    }
    case RingMethod::kLookup: {
      auto* r = Parse<v1::LookupRequest>(arena, request, session_id);
      if (r == nullptr) return Unparsable(method);
      const uint64_t bound =
          kScalarBytes + static_cast<uint64_t>(r->keys_size()) * kRunBytes;
      if (bound > answer_capacity) return TooLarge(bound, answer_capacity);
      // A miss may wait for the storage tier: not on the ring's thread,
      // where the session's other calls would wait behind it.
      if (handler.has_tier()) {
        return RingAnswer{kRingUseGrpc, "a Lookup may wait for the storage tier"};
      }
      return Answer(handler.Lookup(*r, deadline));
    }
    case RingMethod::kRelease: {
      auto* r = Parse<v1::ReleaseRequest>(arena, request, session_id);
      if (r == nullptr) return Unparsable(method);
      return Answer(handler.Release(*r));
    }
    case RingMethod::kPublish: {
      auto* r = Parse<v1::PublishRequest>(arena, request, session_id);
      if (r == nullptr) return Unparsable(method);
      // A PublishResult: outcome and page, their tags, the field's tag and
      // length.
      const uint64_t bound =
          kScalarBytes + static_cast<uint64_t>(r->items_size()) * 16;
      if (bound > answer_capacity) return TooLarge(bound, answer_capacity);
      // Pages a copy still fills would make it wait (--cache_publish_wait):
      // not on the ring's thread, where the session's other calls would
      // wait behind it. Such a Publish changes nothing and goes over gRPC.
      absl::StatusOr<v1::PublishResponse> published =
          handler.PublishWithin(*r, absl::ZeroDuration());
      if (absl::IsDeadlineExceeded(published.status())) {
        return RingAnswer{kRingUseGrpc, "a copy still fills the pages"};
      }
      return Answer(published);
    }
    case RingMethod::kListEvictions: {
      auto* r = Parse<v1::ListEvictionsRequest>(arena, request, session_id);
      if (r == nullptr) return Unparsable(method);
      // A key: up to 64 bytes, its tag and length.
      const uint64_t bound =
          kScalarBytes + static_cast<uint64_t>(r->max_keys()) * 66;
      if (bound > answer_capacity) return TooLarge(bound, answer_capacity);
      return Answer(handler.ListEvictions(*r));
    }
  }
  return Unparsable(method);
}

}  // namespace hostkv
