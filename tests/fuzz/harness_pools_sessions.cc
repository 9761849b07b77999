// Harness: CreatePool, DeletePool, OpenSession, CloseSession/EndSession,
// AttachSession, the idle-session sweep and GetPoolStats.
#include <unistd.h>

#include "absl/time/time.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/harness.h"

namespace hostkv::fuzz {

void Harness::DoCreatePool() {
  v1::CreatePoolRequest r;
  v1::PoolSpec& spec = *r.mutable_spec();
  const uint8_t sel = fdp_->ConsumeIntegral<uint8_t>();
  if (sel < 32) {  // a base pool again, maybe changed
    spec = BaseSpec(sel % 2);
    if (sel & 4) spec.set_page_size(spec.page_size() + 1);
    r.set_attach_if_exists(sel & 8);
  } else {
    spec.set_name(sel < 240 ? kFuzzPools[sel % 3] : PickPoolName());
    auto* geo = spec.mutable_geometry();
    geo->set_dtype(
        static_cast<v1::Dtype>(fdp_->ConsumeIntegralInRange<int>(0, 6)));
    auto small = [&](uint32_t max) {
      return OneIn(12) ? static_cast<uint32_t>(PickU64(max))
                       : fdp_->ConsumeIntegralInRange<uint32_t>(1, max);
    };
    if (OneIn(2)) {
      auto* mha = geo->mutable_mha();
      mha->set_num_layers(small(4));
      mha->set_num_kv_heads(small(4));
      mha->set_head_dim(small(16));
    } else if (!OneIn(16)) {
      auto* mla = geo->mutable_mla();
      mla->set_num_layers(small(4));
      mla->set_kv_lora_rank(small(16));
      mla->set_qk_rope_head_dim(fdp_->ConsumeIntegralInRange<uint32_t>(0, 8));
    }
    static constexpr uint32_t kPageSizes[] = {1, 2, 3, 4, 8, 16};
    spec.set_page_size(
        OneIn(12) ? static_cast<uint32_t>(PickU64(16))
                  : kPageSizes[fdp_->ConsumeIntegralInRange<int>(0, 5)]);
    spec.set_layout(
        static_cast<v1::Layout>(fdp_->ConsumeIntegralInRange<int>(0, 6)));
    switch (fdp_->ConsumeIntegralInRange<int>(0, 7)) {
      case 0:
        spec.set_capacity_bytes(PickU64(1 << 16));
        break;
      case 1:
        spec.set_capacity_tokens(PickU64(512));
        break;
      case 2:
        break;  // none
      default:
        spec.set_capacity_tokens(
            fdp_->ConsumeIntegralInRange<uint64_t>(1, 512));
        break;
    }
    if (OneIn(4)) spec.set_device_pool_tokens(PickU64(512));
    spec.set_default_mechanism(static_cast<v1::CopyMechanism>(
        fdp_->ConsumeIntegralInRange<int>(0, 4)));
    r.set_attach_if_exists(OneIn(2));
  }
  auto s = handler_.CreatePool(r);
  Note(s.ok());
  if (!s.ok()) return;
  auto pool = FindPool(spec.name());
  FUZZ_CHECK(pool != nullptr, "created pool ", spec.name(), " not found");
  const PoolGeometry& g = pool->geometry();
  FUZZ_CHECK(g.page_size != 0 && g.token_slots % g.page_size == 0 &&
             s->num_pages() == g.num_pages() &&
             s->total_bytes() == g.total_bytes() &&
             g.total_bytes() <= kBudgetBytes);
}

void Harness::DoDeletePool() {
  v1::DeletePoolRequest r;
  r.set_name(PickPoolName());
  const bool existed = FindPool(r.name()) != nullptr;
  bool in_use = false;
  for (const SessionModel& s : live_) {
    auto it = s.pages.find(r.name());
    if (it != s.pages.end() && !it->second.empty()) in_use = true;
    for (const ImportModel& i : s.imports) in_use |= i.pool == r.name();
  }
  const bool engine_idle = transfers_.queued() == 0;
  auto s = handler_.DeletePool(r);
  Note(s.ok());
  if (s.ok()) {
    FUZZ_CHECK(existed && !in_use, "DeletePool of ", r.name(),
               " in use accepted");
    for (SessionModel& m : live_) m.pages.erase(r.name());
  } else {
    FUZZ_CHECK(!(existed && !in_use && engine_idle), "DeletePool of unused ",
               r.name(), " refused: ", s.status().ToString());
  }
}

void Harness::DoOpenSession() {
  v1::OpenSessionRequest r;
  r.set_client_name(
      OneIn(8)
          ? std::string(fdp_->ConsumeIntegralInRange<size_t>(250, 300), 'c')
          : fdp_->ConsumeRandomLengthString(32));
  r.set_pid(fdp_->ConsumeIntegral<uint32_t>());
  if (live_.size() >= kMaxSessions) {
    CloseLive(0, /*expect_ok=*/true);
  }
  auto s = handler_.OpenSession(r);
  Note(s.ok());
  FUZZ_CHECK(s.ok() == (r.client_name().size() <= 256),
             "OpenSession: ", s.status().ToString());
  if (!s.ok()) return;
  FUZZ_CHECK(s->signal_slots() == kSignalRecords && s->session_id() != 0);
  FUZZ_CHECK(FindLive(s->session_id()) == nullptr, "session id reused");
  AddLive(s->session_id());
}

void Harness::DoCloseSession() {
  const uint64_t id = PickSessionId();
  for (size_t i = 0; i < live_.size(); ++i) {
    if (live_[i].id == id) {
      CloseLive(i, /*expect_ok=*/true, /*end=*/OneIn(3));
      if (outstanding_ != 0) Quiesce();
      return;
    }
  }
  v1::CloseSessionRequest r;
  r.set_session_id(id);
  FUZZ_CHECK(!handler_.CloseSession(r).ok(), "closed unknown session ", id);
  FUZZ_CHECK(!handler_.EndSession(id, "fuzz").ok(), "ended unknown session ",
             id);
}

void Harness::DoAttachSession() {
  const uint64_t id = PickSessionId();
  uint32_t uid = geteuid();
  switch (fdp_->ConsumeIntegralInRange<int>(0, 7)) {
    case 6:
      uid = 0;
      break;
    case 7:
      uid = fdp_->ConsumeIntegral<uint32_t>();
      break;
    default:
      break;
  }
  Note(Attach(id, uid).ok());
}

// Ends the unattached sessions (a lease of zero), as the session monitor
// does for those idle longer than the lease; copies may be in flight.
void Harness::DoExpireIdle() {
  handler_.ExpireIdleSessions(absl::ZeroDuration());
  Note(true);
  Reconcile();
}

void Harness::DoGetPoolStats() {
  v1::GetPoolStatsRequest r;
  if (!OneIn(3)) r.set_pool(PickPoolName());
  auto s = handler_.GetPoolStats(r);
  Note(s.ok());
  if (!s.ok()) return;
  FUZZ_CHECK(s->open_sessions() == live_.size());
  FUZZ_CHECK(s->memory_reserved_bytes() <= kBudgetBytes);
  for (const v1::PoolStats& p : s->pools()) {
    FUZZ_CHECK(p.used_pages() + p.free_pages() == p.capacity_pages(),
               p.ShortDebugString());
    uint64_t model = 0;
    for (const SessionModel& m : live_) {
      auto it = m.pages.find(p.name());
      if (it != m.pages.end()) model += it->second.size();
    }
    uint64_t listed = 0;
    for (const v1::SessionUsage& u : p.sessions()) listed += u.pages();
    FUZZ_CHECK(p.used_pages() == model && listed == model, "stats of ",
               p.name(), ": used ", p.used_pages(), " listed ", listed,
               " model ", model);
  }
  FUZZ_CHECK(s->sessions_size() == static_cast<int>(live_.size()));
  for (const v1::SessionInfo& info : s->sessions()) {
    const SessionModel* m = nullptr;
    for (const SessionModel& l : live_) {
      if (l.tag == info.session_number()) m = &l;
    }
    FUZZ_CHECK(m != nullptr, "stats list unknown session ",
               info.session_number());
    FUZZ_CHECK(info.attached() == m->attached &&
                   info.pages() == m->TotalPages() &&
                   info.imports() == m->imports.size() &&
                   (!m->attached || info.uid() == m->uid),
               "stats of session ", info.ShortDebugString(),
               " vs model: attached ", m->attached, " pages ", m->TotalPages(),
               " imports ", m->imports.size());
  }
}

}  // namespace hostkv::fuzz
