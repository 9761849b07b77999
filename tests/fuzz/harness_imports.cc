// Harness: RegisterDeviceBuffers (well-formed, or with a few things
// mangled) and UnregisterDeviceBuffers.
#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/harness.h"

namespace hostkv::fuzz {

Harness::DeviceTarget Harness::DeviceSegment() const {
  DeviceTarget t;
  t.shm_name = device_.name();
  t.data = device_.data();
  t.size = kDeviceBytes;
  return t;
}

// Where a registration by `m` puts its buffers: mostly device_, sometimes
// a descriptor `m` passed, now and then a handle it never got (`known`
// false).
Harness::DeviceTarget Harness::PickTarget(const SessionModel* m, bool* known) {
  *known = true;
  const uint8_t sel = fdp_->ConsumeIntegral<uint8_t>();
  if (m != nullptr && !m->passed.empty() && sel < 96) {
    const PassedFdModel& p = m->passed[sel % m->passed.size()];
    DeviceTarget t;
    t.passed_fd = p.handle;
    t.data = p.mapping->data();
    t.size = p.mapping->size();
    t.mapping = p.mapping;
    return t;
  }
  if (sel >= 248) {
    *known = false;
    DeviceTarget t;
    t.passed_fd = 1000 + sel;  // a session passes at most a few
    return t;
  }
  return DeviceSegment();
}

// A well-formed registration of `target` for `pool`: token_slots rows per
// buffer, buffers back to back from `base`.
absl::StatusOr<v1::RegisterDeviceBuffersResponse> Harness::RegisterValid(
    size_t live_index, const std::string& pool_name, uint64_t token_slots,
    uint64_t base, const DeviceTarget& target) {
  auto pool = FindPool(pool_name);
  FUZZ_CHECK(pool != nullptr);
  v1::RegisterDeviceBuffersRequest r;
  ImportModel model;
  BuildRegistration(*pool, token_slots, base, target, &r, &model);
  r.set_session_id(live_[live_index].id);
  auto s = handler_.RegisterDeviceBuffers(r);
  Note(s.ok());
  if (s.ok()) {
    model.id = s->import_id();
    live_[live_index].imports.push_back(std::move(model));
  }
  return s;
}

void Harness::BuildRegistration(const HostPool& pool, uint64_t token_slots,
                                uint64_t base, const DeviceTarget& target,
                                v1::RegisterDeviceBuffersRequest* r,
                                ImportModel* model) {
  const PoolGeometry& g = pool.geometry();
  r->set_pool(pool.name());
  r->set_token_slots(token_slots);
  model->pool = pool.name();
  model->token_slots = token_slots;
  model->bytes = ImportBytes(g, token_slots);
  model->data = target.data;
  model->mapping = target.mapping;
  const uint64_t buffer = token_slots * g.token_stride();
  uint64_t at = base;
  for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      v1::DeviceBuffer* b = kv == 0 ? r->add_k_buffers() : r->add_v_buffers();
      if (target.passed_fd != 0) {
        b->set_passed_fd(target.passed_fd);
      } else {
        b->set_shm_name(target.shm_name);
      }
      b->set_offset(at);
      b->set_size(buffer);
      model->offsets[kv].push_back(at);
      at += buffer;
    }
  }
}

// The device bytes the daemon counts for a registration (saturating, as it
// does; token_slots passed CheckImportShape).
uint64_t Harness::ImportBytes(const PoolGeometry& g, uint64_t token_slots) {
  const uint64_t per_buffer = token_slots * g.token_stride();
  const uint64_t buffers = uint64_t{g.num_layers} * g.kv_planes();
  return per_buffer > kU64Max / buffers ? kU64Max : per_buffer * buffers;
}

// Mangles one thing in a registration.
void Harness::Mangle(v1::RegisterDeviceBuffersRequest* r,
                     const HostPool* pool) {
  auto* list = OneIn(2) || r->v_buffers_size() == 0 ? r->mutable_k_buffers()
                                                    : r->mutable_v_buffers();
  v1::DeviceBuffer* b = list->empty()
                            ? nullptr
                            : list->Mutable(fdp_->ConsumeIntegralInRange<int>(
                                  0, list->size() - 1));
  switch (fdp_->ConsumeIntegralInRange<int>(0, 14)) {
    case 0:
      if (b) b->set_offset(PickU64(kDeviceBytes));
      break;
    case 1:
      if (b) b->set_size(PickU64(kDeviceBytes));
      break;
    case 2:
      if (b) {  // offset + size wraps
        b->set_offset(PickU64(kDeviceBytes));
        b->set_size(kU64Max - b->offset() + 1 +
                    fdp_->ConsumeIntegralInRange<uint64_t>(0, 64));
      }
      break;
    case 3:
      if (!list->empty()) list->RemoveLast();
      break;
    case 4: {
      const v1::DeviceBuffer copy =
          list->empty() ? v1::DeviceBuffer() : list->Get(0);
      *list->Add() = copy;
      break;
    }
    case 5:
      r->set_token_slots(PickU64(kMaxDeviceSlots));
      break;
    case 6:
      if (b) {
        switch (fdp_->ConsumeIntegralInRange<int>(0, 6)) {
          case 0:
            b->set_shm_name("");
            break;
          case 1:
            b->set_shm_name("relative");
            break;
          case 2:
            b->set_shm_name("/..");
            break;
          case 3:
            b->set_shm_name(pool ? pool->info().segment_name() : prefix_ + "x");
            break;
          case 4:
            b->set_shm_name(small_device_.name());
            break;
          case 5:
            b->set_shm_name(
                absl::StrCat("/hostkv-fuzzdev.", getpid(), ".none"));
            break;
          default:
            b->set_shm_name("/" + fdp_->ConsumeRandomLengthString(210));
            break;
        }
      }
      break;
    case 7:
      if (b)
        b->set_cuda_ipc_handle(std::string(
            OneIn(2) ? 64 : fdp_->ConsumeIntegralInRange<int>(0, 80), 'h'));
      break;
    case 8:
      if (b) b->clear_handle();
      break;
    case 9:
      if (!live_.empty()) {  // another session's signal segment
        auto s = sessions_.Get(live_[0].id);
        if (s.ok() && b) b->set_shm_name((*s)->signals()->name());
      }
      break;
    case 10:
      if (b) b->set_device(fdp_->ConsumeIntegral<int32_t>());
      break;
    case 11:
      if (b) {
        b->set_device_uuid(
            std::string(fdp_->ConsumeIntegralInRange<int>(0, 20), 'u'));
      }
      break;
    case 12: {  // GPU signal words: refused without a CUDA backend
      v1::DeviceBuffer* signals = r->mutable_gpu_signals();
      if (OneIn(2)) {
        signals->set_cuda_ipc_handle(std::string(
            OneIn(2) ? 64 : fdp_->ConsumeIntegralInRange<int>(0, 80), 's'));
      } else {
        signals->set_shm_name(small_device_.name());
      }
      signals->set_offset(PickU64(kDeviceBytes));
      signals->set_size(PickU64(kDeviceBytes));
      break;
    }
    case 13:  // a passed descriptor: 0 (no handle), maybe one passed
      if (b) b->set_passed_fd(fdp_->ConsumeIntegralInRange<uint64_t>(0, 3));
      break;
    default:
      r->set_token_slots(r->token_slots() + 1);
      break;
  }
}

// The code a well-formed registration by `m` gets, in the order the handler
// checks: pool use, the uid's imports, an attached socket, the segment's
// owner (or the passed descriptor), the session's imports and bytes.
absl::StatusCode Harness::ExpectedCleanRegister(const SessionModel& m,
                                                const HostPool& pool,
                                                const DeviceTarget& target,
                                                bool target_known,
                                                uint64_t bytes) const {
  if (!MayUsePool(pool_owners_.at(pool.name()), m)) {
    return absl::StatusCode::kPermissionDenied;
  }
  if (m.attached && ImportsOfUid(m.uid) >= kMaxImportsPerUid) {
    return absl::StatusCode::kResourceExhausted;
  }
  if (!m.attached) return absl::StatusCode::kFailedPrecondition;
  if (target.passed_fd == 0 && !OwnsDeviceSegments(&m)) {
    return absl::StatusCode::kPermissionDenied;
  }
  if (!target_known) return absl::StatusCode::kNotFound;
  if (m.imports.size() >= kMaxImportsPerSession ||
      bytes > kMaxImportBytesPerSession - m.ImportBytes()) {
    return absl::StatusCode::kResourceExhausted;
  }
  return absl::StatusCode::kOk;
}

// What was accepted must fit where it points, in segments the session may
// register: device_ and small_device_ by name only for their owner, passed
// descriptors only by handles the session got.
void Harness::CheckAcceptedBuffers(const v1::RegisterDeviceBuffersRequest& r,
                                   const SessionModel& m,
                                   const HostPool& pool) {
  for (const auto* list : {&r.k_buffers(), &r.v_buffers()}) {
    for (const v1::DeviceBuffer& b : *list) {
      FUZZ_CHECK(b.size() >= r.token_slots() * pool.geometry().token_stride());
      uint64_t seg = 0;
      if (b.has_passed_fd()) {
        const PassedFdModel* p = m.FindPassed(b.passed_fd());
        FUZZ_CHECK(p != nullptr, "registration accepted passed_fd ",
                   b.passed_fd(), ", which the session never passed");
        seg = p->mapping->size();
      } else {
        FUZZ_CHECK(OwnsDeviceSegments(&m), "registration of ", b.shm_name(),
                   " (uid ", device_.owner_uid(), ") accepted for uid ", m.uid);
        seg = b.shm_name() == device_.name()         ? kDeviceBytes
              : b.shm_name() == small_device_.name() ? kSmallDeviceBytes
                                                     : 0;
      }
      FUZZ_CHECK(seg != 0 && b.offset() <= seg && b.size() <= seg - b.offset(),
                 "registration accepted a buffer outside its segment: ",
                 b.ShortDebugString());
    }
  }
}

void Harness::DoRegister() {
  const SessionId session_id = PickSessionId();
  const std::string pool_name = PickPoolName();
  const auto pool = FindPool(pool_name);
  SessionModel* m = FindLive(session_id);
  bool target_known = true;
  const DeviceTarget target = PickTarget(m, &target_known);
  v1::RegisterDeviceBuffersRequest r;
  ImportModel model;
  bool clean = false;
  if (pool != nullptr) {
    const PoolGeometry& g = pool->geometry();
    const uint64_t room_all = target_known ? target.size : kDeviceBytes;
    const uint64_t row_all = g.kv_planes() * g.num_layers * g.token_stride();
    const uint64_t fit = room_all / row_all;
    const uint64_t slots = fdp_->ConsumeIntegralInRange<uint64_t>(
        1, std::max<uint64_t>(1, std::min(fit, kMaxDeviceSlots)));
    const uint64_t room = room_all - std::min(room_all, slots * row_all);
    const uint64_t base = fdp_->ConsumeIntegralInRange<uint64_t>(0, room);
    BuildRegistration(*pool, slots, base, target, &r, &model);
    clean = slots * row_all <= room_all;
  } else {
    r.set_pool(pool_name);
    r.set_token_slots(PickU64(kMaxDeviceSlots));
  }
  r.set_session_id(session_id);
  const int mangles = OneIn(3) ? fdp_->ConsumeIntegralInRange<int>(1, 3) : 0;
  for (int i = 0; i < mangles; ++i) Mangle(&r, pool.get());
  if (mangles != 0) clean = false;
  auto s = handler_.RegisterDeviceBuffers(r);
  Note(s.ok());
  if (!CheckSessionAnswer(session_id, s.status(), "Register")) return;
  if (pool == nullptr) {
    FUZZ_CHECK(IsUnknownPoolAnswer(pool_name, s.status()), "Register for unknown pool ",
               pool_name, ": ", s.status().ToString());
    return;
  }
  const PoolGeometry& g = pool->geometry();
  const bool may_use = MayUsePool(pool_owners_.at(pool_name), *m);
  FUZZ_CHECK(may_use || absl::IsPermissionDenied(s.status()),
             "Register by uid ", m->uid, m->attached ? "" : " (unattached)",
             " for pool ", pool_name, " owned by ",
             pool_owners_.at(pool_name).ShortDebugString(), ": ",
             s.status().ToString());
  if (!may_use) return;
  // Each limit is named when it is the reason, and only then.
  const uint64_t bytes = ImportBytes(g, r.token_slots());
  const bool uid_full =
      m->attached && ImportsOfUid(m->uid) >= kMaxImportsPerUid;
  const bool session_full = m->imports.size() >= kMaxImportsPerSession;
  const bool bytes_full = bytes > kMaxImportBytesPerSession - m->ImportBytes();
  if (absl::IsResourceExhausted(s.status())) {
    const bool named =
        (uid_full &&
         absl::StrContains(s.status().message(), "--max_imports_per_uid")) ||
        (session_full && absl::StrContains(s.status().message(),
                                           "--max_imports_per_session")) ||
        (bytes_full && absl::StrContains(s.status().message(),
                                         "--max_import_bytes_per_session"));
    FUZZ_CHECK(named, "Register exhausted with imports uid ",
               ImportsOfUid(m->uid), " session ", m->imports.size(), " bytes ",
               m->ImportBytes(), "+", bytes, ": ", s.status().ToString());
  }
  if (clean) {
    const absl::StatusCode want =
        ExpectedCleanRegister(*m, *pool, target, target_known, model.bytes);
    FUZZ_CHECK(s.status().code() == want, "a well-formed registration (",
               target.passed_fd != 0 ? "passed fd" : "shm name", ", uid ",
               m->uid, m->attached ? "" : " unattached", ") got ",
               s.status().ToString(), ", model says ",
               absl::StatusCodeToString(want));
  }
  if (!s.ok()) return;
  FUZZ_CHECK(m->attached && !uid_full && !session_full && !bytes_full,
             "registration accepted past a limit or for an unattached session");
  FUZZ_CHECK(!r.has_gpu_signals(),
             "a registration without a CUDA backend accepted gpu_signals");
  CheckAcceptedBuffers(r, *m, *pool);
  for (const ImportModel& i : m->imports) {
    FUZZ_CHECK(i.id != s->import_id(), "import id ", i.id, " handed out twice");
  }
  if (!clean) {
    model = ImportModel();
    model.pool = pool_name;
    model.token_slots = r.token_slots();
    model.bytes = bytes;
  }
  model.id = s->import_id();
  if (model.mapping != nullptr) ++passed_fd_imports_;
  m->imports.push_back(std::move(model));
}

void Harness::DoUnregister() {
  v1::UnregisterDeviceBuffersRequest r;
  r.set_session_id(PickSessionId());
  SessionModel* m = FindLive(r.session_id());
  if (m != nullptr && !m->imports.empty() && !OneIn(4)) {
    r.set_import_id(m->imports[fdp_->ConsumeIntegralInRange<size_t>(
                                   0, m->imports.size() - 1)]
                        .id);
  } else {
    r.set_import_id(PickU64(4));
  }
  auto s = handler_.UnregisterDeviceBuffers(r);
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "Unregister")) return;
  bool known = false;
  if (m != nullptr) {
    for (size_t i = 0; i < m->imports.size(); ++i) {
      if (m->imports[i].id != r.import_id()) continue;
      known = true;
      if (s.ok())
        m->imports.erase(m->imports.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  FUZZ_CHECK(s.ok() == known, "Unregister of import ", r.import_id(), ": ",
             s.status().ToString(), ", model says ",
             known ? "known" : "unknown");
}

}  // namespace hostkv::fuzz
