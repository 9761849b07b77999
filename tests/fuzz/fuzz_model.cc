#include "tests/fuzz/fuzz_model.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_check.h"

namespace hostkv::fuzz {

void Die(const std::string& what) {
  std::fprintf(stderr, "request_fuzzer: invariant violated: %s\n",
               what.c_str());
  std::fflush(stderr);
  std::abort();
}

RequestLimits MakeLimits(const std::string& prefix) {
  RequestLimits limits;
  limits.max_page_io_bytes = kMaxPageIoBytes;
  limits.reserved_segment_prefix = prefix;
  // As deployed: shm buffers only for sessions attached by a peer whose uid
  // owns the segments (AttachSession stands in for the session socket).
  limits.allow_unverified_shm_names = false;
  limits.max_imports_per_session = kMaxImportsPerSession;
  limits.max_import_bytes_per_session = kMaxImportBytesPerSession;
  limits.max_imports_per_uid = kMaxImportsPerUid;
  limits.max_passed_fds_per_uid = kMaxPassedFdsPerUid;
  limits.pool_access = kPoolAccess;
  return limits;
}

SessionLimits MakeSessionLimits() {
  SessionLimits limits;
  limits.max_sessions = kMaxSessions;
  limits.max_sessions_per_uid = kMaxSessionsPerUid;
  limits.max_unattached_sessions = kMaxUnattachedSessions;
  return limits;
}

PoolQuota MakePoolQuota() {
  PoolQuota quota;
  quota.max_pools_per_uid = kMaxPoolsPerUid;
  quota.max_pool_bytes_per_uid = kMaxPoolBytesPerUid;
  return quota;
}

v1::PoolOwner BaseOwner(int which) {
  v1::PoolOwner owner;
  owner.set_daemon(true);
  owner.set_uid(geteuid());
  owner.set_gid(getegid());
  owner.set_access(which == 0 ? v1::POOL_ACCESS_OWNER : v1::POOL_ACCESS_GROUP);
  return owner;
}

bool MayUsePool(const v1::PoolOwner& owner, const SessionModel& m) {
  if ((m.attached && m.uid == 0) || owner.access() == v1::POOL_ACCESS_ANY) {
    return true;
  }
  const bool group = owner.access() == v1::POOL_ACCESS_GROUP;
  if (owner.unverified()) return !m.attached;
  if (!m.attached) return owner.daemon() && group;
  return m.uid == owner.uid() || (group && m.gid == owner.gid());
}

bool MayAdminPool(const v1::PoolOwner& owner, const SessionModel& m) {
  if (m.attached && m.uid == 0) return true;
  return owner.unverified() ? !m.attached : m.attached && m.uid == owner.uid();
}

v1::PoolOwner OwnerOf(const SessionModel& m) {
  v1::PoolOwner owner;
  owner.set_access(kPoolAccess);
  if (m.attached) {
    owner.set_uid(m.uid);
    owner.set_gid(m.gid);
  } else {
    owner.set_unverified(true);
  }
  return owner;
}

bool SameQuotaOwner(const v1::PoolOwner& a, const v1::PoolOwner& b) {
  if (a.daemon() || b.daemon() || a.unverified() != b.unverified()) {
    return false;
  }
  return a.unverified() || a.uid() == b.uid();
}

v1::PoolSpec BaseSpec(int which) {
  v1::PoolSpec spec;
  spec.set_name(kBasePools[which]);
  if (which == 0) {  // MHA page_first, 2 layers x 2 heads x 4, bf16, 101 pages
    spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
    auto* mha = spec.mutable_geometry()->mutable_mha();
    mha->set_num_layers(2);
    mha->set_num_kv_heads(2);
    mha->set_head_dim(4);
    spec.set_page_size(4);
    spec.set_layout(v1::LAYOUT_PAGE_FIRST);
    spec.set_capacity_tokens(400);
  } else {  // MLA layer_first, 3 layers x (4 + 2), fp16, 151 pages
    spec.mutable_geometry()->set_dtype(v1::DTYPE_FP16);
    auto* mla = spec.mutable_geometry()->mutable_mla();
    mla->set_num_layers(3);
    mla->set_kv_lora_rank(4);
    mla->set_qk_rope_head_dim(2);
    spec.set_page_size(2);
    spec.set_layout(v1::LAYOUT_LAYER_FIRST);
    spec.set_capacity_tokens(300);
    spec.set_default_mechanism(v1::MECHANISM_KERNEL);
  }
  return spec;
}

std::vector<PageRun> ToRuns(
    const google::protobuf::RepeatedPtrField<v1::PageRun>& in) {
  std::vector<PageRun> out;
  for (const v1::PageRun& r : in)
    out.push_back({r.first_page(), r.num_pages()});
  return out;
}

}  // namespace hostkv::fuzz
