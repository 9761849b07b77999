// Harness: RegisterDeviceBuffers (well-formed, or with a few things
// mangled) and UnregisterDeviceBuffers.
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/harness.h"

namespace hostkv::fuzz {

// A well-formed registration of device_ for `pool`: token_slots rows per
// buffer, buffers back to back from `base`.
absl::StatusOr<v1::RegisterDeviceBuffersResponse> Harness::RegisterValid(
    size_t live_index, const std::string& pool_name, uint64_t token_slots,
    uint64_t base) {
  auto pool = FindPool(pool_name);
  FUZZ_CHECK(pool != nullptr);
  v1::RegisterDeviceBuffersRequest r;
  ImportModel model;
  BuildRegistration(*pool, token_slots, base, &r, &model);
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
                                uint64_t base,
                                v1::RegisterDeviceBuffersRequest* r,
                                ImportModel* model) {
  const PoolGeometry& g = pool.geometry();
  r->set_pool(pool.name());
  r->set_token_slots(token_slots);
  model->pool = pool.name();
  model->token_slots = token_slots;
  const uint64_t buffer = token_slots * g.token_stride();
  uint64_t at = base;
  for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      v1::DeviceBuffer* b = kv == 0 ? r->add_k_buffers() : r->add_v_buffers();
      b->set_shm_name(device_.name());
      b->set_offset(at);
      b->set_size(buffer);
      model->offsets[kv].push_back(at);
      at += buffer;
    }
  }
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
  switch (fdp_->ConsumeIntegralInRange<int>(0, 13)) {
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
    default:
      r->set_token_slots(r->token_slots() + 1);
      break;
  }
}

void Harness::DoRegister() {
  const uint64_t session_id = PickSessionId();
  const std::string pool_name = PickPoolName();
  const auto pool = FindPool(pool_name);
  v1::RegisterDeviceBuffersRequest r;
  ImportModel model;
  bool clean = false;
  if (pool != nullptr) {
    const PoolGeometry& g = pool->geometry();
    const uint64_t row_all = g.kv_planes() * g.num_layers * g.token_stride();
    const uint64_t fit = kDeviceBytes / row_all;
    const uint64_t slots = fdp_->ConsumeIntegralInRange<uint64_t>(
        1, std::max<uint64_t>(1, std::min(fit, kMaxDeviceSlots)));
    const uint64_t room =
        kDeviceBytes - std::min(kDeviceBytes, slots * row_all);
    const uint64_t base = fdp_->ConsumeIntegralInRange<uint64_t>(0, room);
    BuildRegistration(*pool, slots, base, &r, &model);
    clean = slots * row_all <= kDeviceBytes;
  } else {
    r.set_pool(pool_name);
    r.set_token_slots(PickU64(kMaxDeviceSlots));
  }
  r.set_session_id(session_id);
  const int mangles = OneIn(3) ? fdp_->ConsumeIntegralInRange<int>(1, 3) : 0;
  for (int i = 0; i < mangles; ++i) Mangle(&r, pool.get());
  if (mangles != 0) clean = false;
  SessionModel* m = FindLive(session_id);
  auto s = handler_.RegisterDeviceBuffers(r);
  Note(s.ok());
  if (!s.ok()) {
    FUZZ_CHECK(
        !(clean && MayRegister(m)),
        "a well-formed registration was refused: ", s.status().ToString());
    return;
  }
  FUZZ_CHECK(m != nullptr && pool != nullptr,
             "registration accepted for a closed session or pool");
  FUZZ_CHECK(MayRegister(m), "shm registration accepted for a session ",
             m->attached ? "attached with a uid that does not own the segment"
                         : "that is not attached");
  FUZZ_CHECK(!r.has_gpu_signals(),
             "a registration without a CUDA backend accepted gpu_signals");
  // What was accepted must fit where it points.
  for (const auto* list : {&r.k_buffers(), &r.v_buffers()}) {
    for (const v1::DeviceBuffer& b : *list) {
      FUZZ_CHECK(b.size() >= r.token_slots() * pool->geometry().token_stride());
      const uint64_t seg = b.shm_name() == device_.name() ? kDeviceBytes
                           : b.shm_name() == small_device_.name()
                               ? kSmallDeviceBytes
                               : 0;
      FUZZ_CHECK(seg != 0 && b.offset() <= seg && b.size() <= seg - b.offset(),
                 "registration accepted a buffer outside its segment: ",
                 b.ShortDebugString());
    }
  }
  for (const ImportModel& i : m->imports) {
    FUZZ_CHECK(i.id != s->import_id(), "import id ", i.id, " handed out twice");
  }
  if (!clean) {
    model = ImportModel();
    model.pool = pool_name;
    model.token_slots = r.token_slots();
  }
  model.id = s->import_id();
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
