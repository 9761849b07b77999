#include "server/service/request_validation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "proto/contract/status_macros.h"

namespace hostkv {

absl::Status CheckCacheKeyCount(size_t count, const char* what) {
  if (count == 0 || count > static_cast<size_t>(kMaxCacheKeysPerRequest)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a request carries 1..", kMaxCacheKeysPerRequest, " ", what, ", not ",
        count, " (split a longer prefix into several calls)"));
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckRunCount(int count, const char* field) {
  if (count == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": no runs given"));
  }
  if (count > kMaxRunsPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", count, " runs exceed the limit of ", kMaxRunsPerRequest));
  }
  return absl::OkStatus();
}

absl::StatusOr<PageRun> CheckedPageRun(uint64_t first, uint64_t count) {
  if (count == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pages: empty run at page ", first));
  }
  return PageRun{first, count};
}

absl::StatusOr<SlotSpan> CheckedSlotSpan(uint64_t first, uint64_t count,
                                         uint64_t token_slots) {
  if (count == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_slots: empty run at slot ", first));
  }
  if (first >= token_slots || count > token_slots - first) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_slots [", first, ", +", count,
        ") out of range: the device buffers have ", token_slots,
        " token slots"));
  }
  return SlotSpan{first, count};
}

absl::Status CheckPairs(int size, const char* field) {
  if (size % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": an odd number of values (want first, count pairs)"));
  }
  return CheckRunCount(size / 2, field);
}

}  // namespace

absl::StatusOr<std::vector<PageRun>> ToPageRuns(
    const google::protobuf::RepeatedPtrField<v1::PageRun>& runs) {
  RETURN_IF_ERROR(CheckRunCount(runs.size(), "pages"));
  std::vector<PageRun> out;
  out.reserve(runs.size());
  for (const v1::PageRun& run : runs) {
    ASSIGN_OR_RETURN(PageRun checked,
                     CheckedPageRun(run.first_page(), run.num_pages()));
    out.push_back(checked);
  }
  return out;
}

absl::StatusOr<std::vector<PageRun>> PairsToPageRuns(
    const google::protobuf::RepeatedField<uint64_t>& pairs) {
  RETURN_IF_ERROR(CheckPairs(pairs.size(), "host_page_pairs"));
  std::vector<PageRun> out;
  out.reserve(pairs.size() / 2);
  for (int i = 0; i < pairs.size(); i += 2) {
    ASSIGN_OR_RETURN(PageRun checked, CheckedPageRun(pairs[i], pairs[i + 1]));
    out.push_back(checked);
  }
  return out;
}

absl::StatusOr<std::vector<PageRun>> TransferHostRuns(
    const v1::TransferRequest& request) {
  if (request.host_pages_size() > 0 && request.host_page_pairs_size() > 0) {
    return absl::InvalidArgumentError(
        "set host_pages or host_page_pairs, not both");
  }
  return request.host_page_pairs_size() > 0
             ? PairsToPageRuns(request.host_page_pairs())
             : ToPageRuns(request.host_pages());
}

absl::Status CheckRunsInPool(const std::vector<PageRun>& runs,
                             uint64_t num_pages) {
  for (const PageRun& run : runs) {
    if (run.first_page >= num_pages || run.num_pages > num_pages - run.first_page) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pages [", run.first_page, ", +", run.num_pages,
          ") out of range: the pool has ", num_pages, " pages"));
    }
  }
  return absl::OkStatus();
}

uint64_t CountPages(const std::vector<PageRun>& runs) {
  uint64_t pages = 0;
  for (const PageRun& run : runs) pages += run.num_pages;
  return pages;
}

absl::StatusOr<std::vector<SlotSpan>> ToDeviceSpans(
    const google::protobuf::RepeatedPtrField<v1::SlotRun>& runs,
    uint64_t token_slots) {
  RETURN_IF_ERROR(CheckRunCount(runs.size(), "device_slots"));
  std::vector<SlotSpan> out;
  out.reserve(runs.size());
  for (const v1::SlotRun& run : runs) {
    ASSIGN_OR_RETURN(SlotSpan span, CheckedSlotSpan(run.first_slot(),
                                                    run.num_slots(), token_slots));
    out.push_back(span);
  }
  return out;
}

absl::StatusOr<std::vector<SlotSpan>> TransferDeviceSpans(
    const v1::TransferRequest& request, uint64_t token_slots) {
  if (request.device_slots_size() > 0 && request.device_slot_pairs_size() > 0) {
    return absl::InvalidArgumentError(
        "set device_slots or device_slot_pairs, not both");
  }
  if (request.device_slot_pairs_size() == 0) {
    return ToDeviceSpans(request.device_slots(), token_slots);
  }
  const auto& pairs = request.device_slot_pairs();
  RETURN_IF_ERROR(CheckPairs(pairs.size(), "device_slot_pairs"));
  std::vector<SlotSpan> out;
  out.reserve(pairs.size() / 2);
  for (int i = 0; i < pairs.size(); i += 2) {
    ASSIGN_OR_RETURN(SlotSpan span,
                     CheckedSlotSpan(pairs[i], pairs[i + 1], token_slots));
    out.push_back(span);
  }
  return out;
}

absl::Status CheckNoOverlap(std::vector<SlotSpan> spans, const char* side) {
  const auto by_first = [](const SlotSpan& a, const SlotSpan& b) {
    return a.first < b.first;
  };
  // Clients send runs in ascending order: one pass then, no sort.
  if (!std::is_sorted(spans.begin(), spans.end(), by_first)) {
    std::sort(spans.begin(), spans.end(), by_first);
  }
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i - 1].first + spans[i - 1].count > spans[i].first) {
      return absl::InvalidArgumentError(absl::StrCat(
          side, ": slot ", spans[i].first,
          " is a destination more than once in the request"));
    }
  }
  return absl::OkStatus();
}

std::vector<SlotSpan> PagesToTokenSpans(const std::vector<PageRun>& runs,
                                        uint32_t page_size) {
  std::vector<SlotSpan> spans;
  spans.reserve(runs.size());
  for (const PageRun& run : runs) {
    spans.push_back({run.first_page * page_size, run.num_pages * page_size});
  }
  return spans;
}

namespace {

constexpr size_t kDeviceUuidBytes = 16;

absl::StatusOr<GpuBufferRef> ToGpuBufferRef(const v1::DeviceBuffer& buffer,
                                            const std::string& where) {
  if (buffer.cuda_ipc_handle().size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": cuda_ipc_handle must be ", kCudaIpcHandleBytes,
        " bytes, got ", buffer.cuda_ipc_handle().size()));
  }
  if (!buffer.device_uuid().empty() &&
      buffer.device_uuid().size() != kDeviceUuidBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": device_uuid must be empty or ", kDeviceUuidBytes,
        " bytes, got ", buffer.device_uuid().size()));
  }
  if (buffer.device() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": device ", buffer.device(), " is negative"));
  }
  return GpuBufferRef{buffer.cuda_ipc_handle(), buffer.offset(), buffer.size(),
                      buffer.device(), buffer.device_uuid()};
}

// Every buffer of a registration names its memory the same way.
absl::Status CheckHandleKind(const v1::DeviceBuffer& buffer,
                             v1::DeviceBuffer::HandleCase kind,
                             const std::string& where) {
  if (buffer.handle_case() == v1::DeviceBuffer::HANDLE_NOT_SET) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": set passed_fd, shm_name or cuda_ipc_handle"));
  }
  // Shared memory by name or by passed descriptor may be mixed.
  const auto cuda = [](v1::DeviceBuffer::HandleCase k) {
    return k == v1::DeviceBuffer::kCudaIpcHandle;
  };
  if (cuda(buffer.handle_case()) != cuda(kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": mixes shm_name and cuda_ipc_handle buffers; one "
               "registration uses one kind"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RegistrationSpec> ToRegistrationSpec(
    const v1::RegisterDeviceBuffersRequest& request) {
  RegistrationSpec spec;
  const v1::DeviceBuffer::HandleCase kind =
      request.k_buffers_size() > 0 ? request.k_buffers(0).handle_case()
                                   : v1::DeviceBuffer::kShmName;
  spec.cuda = kind == v1::DeviceBuffer::kCudaIpcHandle;
  spec.shm.token_slots = spec.gpu.token_slots = request.token_slots();
  const google::protobuf::RepeatedPtrField<v1::DeviceBuffer>* planes[2] = {
      &request.k_buffers(), &request.v_buffers()};
  for (int kv = 0; kv < 2; ++kv) {
    for (int i = 0; i < planes[kv]->size(); ++i) {
      const v1::DeviceBuffer& buffer = (*planes[kv])[i];
      const std::string where =
          absl::StrCat(kv == 0 ? "k_buffers[" : "v_buffers[", i, "]");
      RETURN_IF_ERROR(CheckHandleKind(buffer, kind, where));
      if (spec.cuda) {
        ASSIGN_OR_RETURN(GpuBufferRef ref, ToGpuBufferRef(buffer, where));
        (kv == 0 ? spec.gpu.k : spec.gpu.v).push_back(std::move(ref));
      } else {
        if (buffer.has_passed_fd() && buffer.passed_fd() == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": passed_fd 0 is no handle"));
        }
        DeviceBufferRef ref{buffer.shm_name(), buffer.offset(), buffer.size()};
        ref.passed_fd = buffer.has_passed_fd() ? buffer.passed_fd() : 0;
        (kv == 0 ? spec.shm.k : spec.shm.v).push_back(std::move(ref));
      }
    }
  }
  if (request.has_gpu_signals()) {
    if (!spec.cuda) {
      return absl::InvalidArgumentError(
          "gpu_signals: only CUDA registrations (cuda_ipc_handle) have GPU "
          "signal words");
    }
    RETURN_IF_ERROR(CheckHandleKind(request.gpu_signals(), kind, "gpu_signals"));
    ASSIGN_OR_RETURN(spec.gpu.signals,
                     ToGpuBufferRef(request.gpu_signals(), "gpu_signals"));
  }
  return spec;
}

}  // namespace hostkv
