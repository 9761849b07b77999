#include "server/transfer/device_import.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
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

// Offsets and sizes past this cannot be in a segment (off_t is signed):
// with it, offset + size cannot overflow.
constexpr uint64_t kMaxSegmentBytes = 1ull << 62;

// A byte range [begin, end) of a segment.
struct ByteRange {
  uint64_t begin;
  uint64_t end;
};

// The part of one segment (a name or a passed descriptor) a registration
// uses.
struct SegmentUse {
  DeviceBufferRef ref;          // the first buffer naming it
  std::string key;              // "n:<name>" or "f:<handle>"
  std::vector<ByteRange> rows;  // [offset, offset + need) of each buffer
  uint64_t reach = 0;           // the largest offset + size of its buffers
  std::string reach_where;
};

std::string SegmentKey(const DeviceBufferRef& ref) {
  return ref.passed_fd != 0 ? absl::StrCat("f:", ref.passed_fd)
                            : absl::StrCat("n:", ref.shm_name);
}

std::string SegmentLabel(const DeviceBufferRef& ref) {
  return ref.passed_fd != 0 ? absl::StrCat("passed descriptor ", ref.passed_fd)
                            : ref.shm_name;
}

// `ranges` sorted and merged where they share or touch an OS page: what to
// map, one mapping each.
std::vector<ByteRange> MergeByPage(std::vector<ByteRange> ranges) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
  std::vector<ByteRange> merged;
  for (const ByteRange& r : ranges) {
    // No overflow: ends are below 2^63 (kMaxSegmentBytes + 2^50).
    if (!merged.empty() &&
        r.begin / page * page <= (merged.back().end + page - 1) / page * page) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

absl::Status CheckBufferRef(const DeviceBufferRef& ref, uint64_t need,
                            uint64_t token_slots, const PoolGeometry& g,
                            const ShmAccessPolicy& policy,
                            const std::string& where) {
  if (ref.passed_fd == 0) {
    if (!IsValidShmName(ref.shm_name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": bad shm name '", ref.shm_name,
          "' (want \"/\" then 1..200 of [A-Za-z0-9._-])"));
    }
    if (absl::StartsWith(ref.shm_name, policy.reserved_prefix)) {
      return absl::PermissionDeniedError(absl::StrCat(
          where, ": segment ", ref.shm_name, " belongs to the daemon"));
    }
  }
  if (ref.size < need) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": size ", ref.size, " is smaller than token_slots * ",
        "token_stride = ", token_slots, " * ", g.token_stride(), " = ", need));
  }
  if (ref.offset > kMaxSegmentBytes || ref.size > kMaxSegmentBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": offset ", ref.offset, " + size ", ref.size,
        " exceeds any segment (2^62 bytes)"));
  }
  return absl::OkStatus();
}

// PermissionDenied unless `policy` lets the session register the segment
// `st` describes. The owner is read from the descriptor the daemon maps: no
// window between the check and the mapping. Root is checked like anyone
// else: a root client registers root's segments.
absl::Status CheckSegmentOwner(const struct stat& st, const std::string& label,
                               const ShmAccessPolicy& policy,
                               const std::string& where) {
  if (!policy.peer_uid.has_value()) return absl::OkStatus();  // unverified
  if (st.st_uid == *policy.peer_uid) return absl::OkStatus();
  const bool group_rw = (st.st_mode & (S_IRGRP | S_IWGRP)) == (S_IRGRP | S_IWGRP);
  if (policy.shared_group.has_value() && st.st_gid == *policy.shared_group &&
      group_rw) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      where, ": segment ", label, " belongs to uid ", st.st_uid,
      ", not to the client's uid ", *policy.peer_uid,
      policy.shared_group.has_value()
          ? " (nor is it group read-write in --shm_group)"
          : ""));
}

// One descriptor of the segment `use` names, checked: every range of it is
// mapped from this same descriptor, so one registration never spans two
// files.
absl::StatusOr<ScopedFd> OpenSegment(const SegmentUse& use,
                                     const ShmAccessPolicy& policy) {
  const std::string& where = use.reach_where;
  if (use.ref.passed_fd != 0) {
    if (!policy.passed_fd) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": this session cannot pass descriptors"));
    }
    absl::StatusOr<ScopedFd> fd = policy.passed_fd(use.ref.passed_fd);
    if (!fd.ok()) {
      return absl::Status(fd.status().code(),
                          absl::StrCat(where, ": ", fd.status().message()));
    }
    // Sealed against shrinking when it was passed; seals cannot be removed.
    return fd;
  }
  ScopedFd fd(shm_open(use.ref.shm_name.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (fd.get() < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat(where, ": shm_open ", use.ref.shm_name,
                                         ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
    return absl::InvalidArgumentError(msg);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return absl::InternalError(absl::StrCat(where, ": fstat: ", std::strerror(errno)));
  }
  RETURN_IF_ERROR(CheckSegmentOwner(st, use.ref.shm_name, policy, where));
  return fd;
}

// Maps the OS pages of `range` of the segment behind `fd` and checks that
// every buffer lies within the segment.
absl::StatusOr<ShmSegment> MapSegmentRange(const SegmentUse& use, int fd,
                                           const ByteRange& range) {
  absl::StatusOr<ShmSegment> segment = ShmSegment::MapFdRange(
      fd, SegmentLabel(use.ref), range.begin, range.end - range.begin,
      ShmSegment::Access::kReadWrite);
  if (!segment.ok()) {
    // A range beyond the end: the buffer that reaches furthest does too.
    return absl::Status(segment.status().code(),
                        absl::StrCat(use.reach_where, ": ",
                                     segment.status().message()));
  }
  if (use.reach > segment->file_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        use.reach_where, ": offset + size ", use.reach, " exceeds segment ",
        SegmentLabel(use.ref), " of ", segment->file_size(), " bytes"));
  }
  return segment;
}

}  // namespace

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
  import->layers_.resize(g.num_layers, LayerBuffers{{nullptr, nullptr}});
  const std::vector<DeviceBufferRef>* planes[2] = {&spec.k, &spec.v};
  auto where = [](uint32_t kv, uint32_t l) {
    return absl::StrCat(kv == 0 ? "k_buffers[" : "v_buffers[", l, "]");
  };
  // Pass 1: check each buffer on its own and gather, per segment, the bytes
  // the copies touch (the first `need` of each buffer) and how far the
  // largest buffer reaches.
  std::vector<SegmentUse> uses;
  absl::flat_hash_map<std::string, size_t> by_key;  // SegmentKey -> uses index
  for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      const DeviceBufferRef& ref = (*planes[kv])[l];
      RETURN_IF_ERROR(
          CheckBufferRef(ref, need, spec.token_slots, g, policy, where(kv, l)));
      const std::string key = SegmentKey(ref);
      auto [it, inserted] = by_key.try_emplace(key, uses.size());
      if (inserted) uses.push_back(SegmentUse{ref, key});
      SegmentUse& use = uses[it->second];
      use.rows.push_back({ref.offset, ref.offset + need});
      if (ref.offset + ref.size >= use.reach) {
        use.reach = ref.offset + ref.size;
        use.reach_where = where(kv, l);
      }
    }
  }
  // Pass 2: open each segment once, then map the union of its rows, page by
  // page: a sparse segment costs only the address space of what is
  // registered in it.
  for (const SegmentUse& use : uses) {
    ASSIGN_OR_RETURN(ScopedFd fd, OpenSegment(use, policy));
    for (const ByteRange& range : MergeByPage(use.rows)) {
      ASSIGN_OR_RETURN(ShmSegment segment, MapSegmentRange(use, fd.get(), range));
      // The buffers whose rows start in this range.
      for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
        for (uint32_t l = 0; l < g.num_layers; ++l) {
          const DeviceBufferRef& ref = (*planes[kv])[l];
          if (SegmentKey(ref) == use.key && ref.offset >= range.begin &&
              ref.offset < range.end) {
            import->layers_[l].plane[kv] =
                segment.data() + (ref.offset - range.begin);
          }
        }
      }
      import->segments_.push_back(std::move(segment));
    }
  }
  return import;
}

}  // namespace hostkv
