#include "server/device_import.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/contract/status_macros.h"

namespace hostkv {
namespace {

constexpr uint64_t kMaxDeviceTokenSlots = 1ull << 40;
// Most bytes one device buffer may need (token_slots * token_stride): with
// this cap the product cannot overflow, nor can any row offset below it.
constexpr uint64_t kMaxDeviceBufferBytes = 1ull << 50;

}  // namespace

absl::Status CheckImportShape(const PoolGeometry& g, uint64_t token_slots,
                              size_t k_buffers, size_t v_buffers) {
  if (token_slots == 0 || token_slots > kMaxDeviceTokenSlots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token_slots must be in [1, 2^40], got ", token_slots));
  }
  if (token_slots > kMaxDeviceBufferBytes / g.token_stride()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token_slots ", token_slots, " x token_stride ", g.token_stride(),
        " exceeds 2^50 bytes per buffer"));
  }
  if (k_buffers != g.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k_buffers: the pool has ", g.num_layers, " layers, got ", k_buffers,
        " buffers"));
  }
  const size_t want_v = g.attention == Attention::kMha ? g.num_layers : 0;
  if (v_buffers != want_v) {
    return absl::InvalidArgumentError(absl::StrCat(
        "v_buffers: expected ", want_v, " for this ",
        g.attention == Attention::kMha ? "MHA" : "MLA", " pool, got ",
        v_buffers));
  }
  return absl::OkStatus();
}

std::unique_ptr<DeviceImport> DeviceImport::ForGpu(
    std::shared_ptr<HostPool> pool, uint64_t token_slots,
    std::vector<LayerBuffers> layers, std::unique_ptr<GpuImportState> gpu) {
  std::unique_ptr<DeviceImport> import(
      new DeviceImport(std::move(pool), token_slots));
  import->layers_ = std::move(layers);
  import->gpu_ = std::move(gpu);
  return import;
}

DeviceImport::DeviceImport(std::shared_ptr<HostPool> pool, uint64_t token_slots)
    : pool_(std::move(pool)), token_slots_(token_slots) {
  pool_->imports().fetch_add(1);
}

DeviceImport::~DeviceImport() {
  // The mappings close first: once the pool stops counting this import, its
  // buffers are no longer touched.
  gpu_.reset();
  segments_.clear();
  pool_->imports().fetch_sub(1);
}

absl::Status CheckSealedMemfd(int fd) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(
        "the passed descriptor is not a memfd (memfd_create with "
        "MFD_ALLOW_SEALING)");
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(
        "the passed memfd is not sealed against shrinking: add F_SEAL_SHRINK "
        "(fcntl F_ADD_SEALS) after sizing it");
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return absl::InvalidArgumentError("the passed memfd is not open read-write");
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
    return absl::InvalidArgumentError("the passed memfd is empty");
  }
  return absl::OkStatus();
}

namespace {

// PermissionDenied unless `policy` lets the session register `segment`.
absl::Status CheckSegmentOwner(const ShmSegment& segment,
                               const ShmAccessPolicy& policy,
                               const std::string& where) {
  if (!policy.peer_uid.has_value()) return absl::OkStatus();  // unverified
  if (segment.owner_uid() == *policy.peer_uid) return absl::OkStatus();
  // The owner is read from the descriptor the daemon maps: no window
  // between the check and the mapping. Root is checked like anyone else:
  // a root client registers root's segments.
  const bool group_rw = (segment.mode() & (S_IRGRP | S_IWGRP)) == (S_IRGRP | S_IWGRP);
  if (policy.shared_group.has_value() && segment.owner_gid() == *policy.shared_group &&
      group_rw) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      where, ": segment ", segment.name(), " belongs to uid ",
      segment.owner_uid(), ", not to the client's uid ", *policy.peer_uid,
      policy.shared_group.has_value() ? " (nor is it group read-write in --shm_group)"
                                      : ""));
}

// Opens the segment `ref` names.
absl::StatusOr<ShmSegment> OpenSegment(const DeviceBufferRef& ref,
                                       const ShmAccessPolicy& policy,
                                       const std::string& where) {
  if (ref.passed_fd != 0) {
    if (!policy.passed_fd) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": this session cannot pass descriptors"));
    }
    absl::StatusOr<ScopedFd> fd = policy.passed_fd(ref.passed_fd);
    if (!fd.ok()) {
      return absl::Status(fd.status().code(),
                          absl::StrCat(where, ": ", fd.status().message()));
    }
    // Checked when it was passed; the seals cannot be removed since.
    return ShmSegment::MapFd(fd->get(), absl::StrCat("passed descriptor ", ref.passed_fd),
                             ShmSegment::Access::kReadWrite);
  }
  if (!IsValidShmName(ref.shm_name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": bad shm name '", ref.shm_name,
        "' (want \"/\" then 1..200 of [A-Za-z0-9._-])"));
  }
  if (absl::StartsWith(ref.shm_name, policy.reserved_prefix)) {
    return absl::PermissionDeniedError(absl::StrCat(
        where, ": segment ", ref.shm_name, " belongs to the daemon"));
  }
  absl::StatusOr<ShmSegment> segment = ShmSegment::Open(ref.shm_name);
  if (!segment.ok()) {
    return absl::Status(segment.status().code(),
                        absl::StrCat(where, ": ", segment.status().message()));
  }
  RETURN_IF_ERROR(CheckSegmentOwner(*segment, policy, where));
  return segment;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceImport>> DeviceImport::OpenShm(
    std::shared_ptr<HostPool> pool, const DeviceImportSpec& spec,
    const ShmAccessPolicy& policy) {
  const PoolGeometry& g = pool->geometry();
  RETURN_IF_ERROR(
      CheckImportShape(g, spec.token_slots, spec.k.size(), spec.v.size()));
  // CheckImportShape bounds the product by 2^50: no overflow.
  const uint64_t need = spec.token_slots * g.token_stride();
  std::unique_ptr<DeviceImport> import(
      new DeviceImport(std::move(pool), spec.token_slots));
  // "n:<name>" or "f:<handle>" -> segments_ index
  absl::flat_hash_map<std::string, size_t> opened;
  import->layers_.resize(g.num_layers, LayerBuffers{{nullptr, nullptr}});
  const std::vector<DeviceBufferRef>* planes[2] = {&spec.k, &spec.v};
  for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      const DeviceBufferRef& ref = (*planes[kv])[l];
      const std::string where =
          absl::StrCat(kv == 0 ? "k_buffers[" : "v_buffers[", l, "]");
      if (ref.size < need) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": size ", ref.size, " is smaller than token_slots * ",
            "token_stride = ", spec.token_slots, " * ", g.token_stride(),
            " = ", need));
      }
      const std::string key = ref.passed_fd != 0 ? absl::StrCat("f:", ref.passed_fd)
                                                 : absl::StrCat("n:", ref.shm_name);
      auto [it, inserted] = opened.try_emplace(key, import->segments_.size());
      if (inserted) {
        ASSIGN_OR_RETURN(ShmSegment segment, OpenSegment(ref, policy, where));
        import->segments_.push_back(std::move(segment));
      }
      const ShmSegment& segment = import->segments_[it->second];
      if (ref.offset > segment.size() || ref.size > segment.size() - ref.offset) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": offset ", ref.offset, " + size ", ref.size,
            " exceeds segment ", segment.name(), " of ", segment.size(), " bytes"));
      }
      import->layers_[l].plane[kv] = segment.data() + ref.offset;
    }
  }
  return import;
}

}  // namespace hostkv
