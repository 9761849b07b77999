// Harness: Load and Backup requests, and the Backup-then-Load round trip
// that checks the device rows come back.
#include <algorithm>
#include <cstring>
#include <set>

#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/harness.h"

namespace hostkv::fuzz {

// Device slot runs adding up to `tokens` within `slots` rows, mostly
// without overlap; sometimes anything.
std::vector<SlotSpan> Harness::PickDeviceRuns(uint64_t tokens, uint64_t slots) {
  std::vector<SlotSpan> runs;
  if (OneIn(6) || tokens == 0 || slots == 0) {
    const int count = fdp_->ConsumeIntegralInRange<int>(0, 3);
    for (int i = 0; i < count; ++i)
      runs.push_back({PickU64(slots), PickU64(tokens)});
    return runs;
  }
  // Split tokens into up to 3 pieces, placed one after another from a
  // random start (wrapping around), which never overlaps if tokens <= slots.
  uint64_t left = tokens;
  uint64_t at = fdp_->ConsumeIntegralInRange<uint64_t>(0, slots - 1);
  for (int i = 0; i < 3 && left > 0; ++i) {
    uint64_t n =
        i == 2 ? left : fdp_->ConsumeIntegralInRange<uint64_t>(1, left);
    n = std::min(n, slots - at);
    runs.push_back({at, n});
    left -= n;
    at = (at + n) % slots;
    if (OneIn(8)) at = fdp_->ConsumeIntegralInRange<uint64_t>(0, slots - 1);
  }
  if (left > 0) runs.push_back({at, left});
  return runs;
}

const ImportModel* Harness::PickImport(const SessionModel* m,
                                       const std::string& pool) {
  if (m == nullptr) return nullptr;
  std::vector<const ImportModel*> match;
  for (const ImportModel& i : m->imports) {
    if (i.pool == pool || OneIn(16)) match.push_back(&i);
  }
  if (match.empty()) return nullptr;
  return match[fdp_->ConsumeIntegralInRange<size_t>(0, match.size() - 1)];
}

// Fills a transfer request; returns the model of the import it names
// (nullptr if none).
const ImportModel* Harness::BuildTransfer(v1::TransferRequest* r) {
  r->set_session_id(PickSessionId());
  r->set_pool(PickPoolName());
  const auto pool = FindPool(r->pool());
  const SessionModel* m = FindLive(r->session_id());
  const ImportModel* import = PickImport(m, r->pool());
  if (import != nullptr && !OneIn(32)) {
    r->set_import_id(import->id);
  } else {
    r->set_import_id(PickU64(m ? m->imports.size() + 1 : 1));
    import = nullptr;
  }
  const uint64_t num_pages = pool ? pool->allocator().num_pages() : 100;
  uint64_t max_pages = UINT64_MAX;
  if (import != nullptr && pool != nullptr && !OneIn(8)) {
    max_pages =
        std::max<uint64_t>(1, import->token_slots / pool->geometry().page_size);
  }
  const std::vector<PageRun> runs =
      PickPageRuns(m, r->pool(), num_pages, max_pages);
  SetRuns(runs, r->mutable_host_pages());
  uint64_t tokens = 0;
  if (pool != nullptr && DistinctPages(runs, num_pages, nullptr)) {
    for (const PageRun& run : runs)
      tokens += run.num_pages * pool->geometry().page_size;
  }
  const uint64_t slots = import ? import->token_slots : kMaxDeviceSlots;
  for (const SlotSpan& span : PickDeviceRuns(tokens, slots)) {
    v1::SlotRun* d = r->add_device_slots();
    d->set_first_slot(span.first);
    d->set_num_slots(span.count);
  }
  const uint32_t layers = pool ? pool->geometry().num_layers : 2;
  if (OneIn(4)) {
    r->set_layer_begin(static_cast<uint32_t>(PickU64(layers)));
    r->set_layer_end(static_cast<uint32_t>(PickU64(layers)));
  } else if (OneIn(3)) {
    const uint32_t b = fdp_->ConsumeIntegralInRange<uint32_t>(0, layers - 1);
    r->set_layer_begin(b);
    r->set_layer_end(fdp_->ConsumeIntegralInRange<uint32_t>(b + 1, layers));
  }
  const uint8_t mech = fdp_->ConsumeIntegral<uint8_t>();
  r->set_mechanism(
      static_cast<v1::CopyMechanism>(mech < 250 ? mech % 3 : mech));
  // "KV written" waits exist for CUDA imports only: always refused here.
  if (OneIn(16)) r->set_wait_kv_written(PickU64(kU64Max));
  // Progress once, at the end: the same copies, one signal publish.
  if (OneIn(4)) r->set_progress_at_end(true);
  // The flat (first, count) pair forms of the same runs, as the client
  // library sends them; now and then both forms, or an odd count.
  const uint8_t form = fdp_->ConsumeIntegral<uint8_t>();
  if (form & 1) {
    for (const v1::PageRun& run : r->host_pages()) {
      r->add_host_page_pairs(run.first_page());
      r->add_host_page_pairs(run.num_pages());
    }
    if (form < 224) r->clear_host_pages();  // else both forms: refused
  }
  if (form & 2) {
    for (const v1::SlotRun& run : r->device_slots()) {
      r->add_device_slot_pairs(run.first_slot());
      r->add_device_slot_pairs(run.num_slots());
    }
    if (form < 224) r->clear_device_slots();
  }
  if (form >= 248) {  // an odd number of values
    r->add_host_page_pairs(PickU64(num_pages));
    r->add_device_slot_pairs(PickU64(slots));
  }
  return import;
}

// The host runs of a transfer request, from whichever form it uses.
std::vector<PageRun> Harness::HostRuns(const v1::TransferRequest& r) {
  if (r.host_page_pairs_size() == 0) return ToRuns(r.host_pages());
  std::vector<PageRun> runs;
  for (int i = 0; i + 1 < r.host_page_pairs_size(); i += 2) {
    runs.push_back({r.host_page_pairs(i), r.host_page_pairs(i + 1)});
  }
  return runs;
}

// After an accepted transfer: waits for it, or (sometimes) lets it run.
void Harness::AfterTransfer(const SessionId& session_id, bool allow_running) {
  if (allow_running && outstanding_ < kMaxOutstanding && OneIn(4)) {
    ++outstanding_;
    return;
  }
  auto session = sessions_.Get(session_id);
  FUZZ_CHECK(session.ok());
  (*session)->signals()->AwaitIdle();
  if (outstanding_ != 0) Quiesce();
}

void Harness::DoTransfer(bool load) {
  v1::TransferRequest r;
  BuildTransfer(&r);
  auto s = ViaRingOrDirect<v1::TransferResponse>(
      load ? RingMethod::kLoad : RingMethod::kBackup, r,
      [&] { return load ? handler_.Load(r) : handler_.Backup(r); });
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "Transfer")) return;
  if (!s.ok()) return;
  const SessionModel* m = FindLive(r.session_id());
  FUZZ_CHECK(m != nullptr, "transfer for a closed session accepted");
  std::vector<uint64_t> pages;
  auto pool = FindPool(r.pool());
  FUZZ_CHECK(r.host_pages_size() == 0 || r.host_page_pairs_size() == 0);
  FUZZ_CHECK(r.device_slots_size() == 0 || r.device_slot_pairs_size() == 0);
  FUZZ_CHECK(r.host_page_pairs_size() % 2 == 0 &&
             r.device_slot_pairs_size() % 2 == 0);
  FUZZ_CHECK(
      pool &&
          DistinctPages(HostRuns(r), pool->allocator().num_pages(), &pages) &&
          AllOwned(m, r.pool(), pages),
      "transfer accepted pages the session does not own: ",
      r.ShortDebugString());
  FUZZ_CHECK(s->num_tokens() == pages.size() * pool->geometry().page_size);
  FUZZ_CHECK(s->signal_index() < kSignalRecords);
  FUZZ_CHECK(r.wait_kv_written() == 0,
             "a CPU import accepted wait_kv_written: ", r.ShortDebugString());
  FUZZ_CHECK(s->signal_value() == 0, "a CPU import returned a signal value");
  AfterTransfer(r.session_id(), /*allow_running=*/true);
}

// Backup device rows into owned pages, load them back elsewhere, compare.
void Harness::DoRoundTrip() {
  if (live_.empty()) return;
  SessionModel& m = live_[PickLiveIndex()];
  std::vector<const ImportModel*> imports;
  for (const ImportModel& i : m.imports) {
    if (!i.offsets[0].empty() && i.data != nullptr) imports.push_back(&i);
  }
  if (imports.empty()) return;
  const ImportModel& imp =
      *imports[fdp_->ConsumeIntegralInRange<size_t>(0, imports.size() - 1)];
  auto pool = FindPool(imp.pool);
  auto owned = m.pages.find(imp.pool);
  if (pool == nullptr || owned == m.pages.end() || owned->second.empty())
    return;
  const PoolGeometry& g = pool->geometry();
  Quiesce();
  // Host pages: a few owned pages, as many as the device rows allow.
  std::vector<PageRun> runs;
  uint64_t tokens = 0;
  for (uint64_t p : owned->second) {
    if (tokens + g.page_size > imp.token_slots) break;
    if (OneIn(3)) continue;
    runs.push_back({p, 1});
    tokens += g.page_size;
  }
  if (runs.empty()) return;
  const std::vector<SlotSpan> src = PickDeviceRuns(tokens, imp.token_slots);
  const std::vector<SlotSpan> dst = PickDeviceRuns(tokens, imp.token_slots);
  auto device_rows = [&](const std::vector<SlotSpan>& spans) {
    std::vector<uint64_t> rows;
    for (const SlotSpan& s : spans) {
      for (uint64_t t = s.first; t < s.first + s.count && rows.size() <= tokens;
           ++t)
        rows.push_back(t);
    }
    return rows;
  };
  const std::vector<uint64_t> src_rows = device_rows(src);
  const std::vector<uint64_t> dst_rows = device_rows(dst);
  if (src_rows.size() != tokens || dst_rows.size() != tokens) return;
  auto in_range = [&](const std::vector<SlotSpan>& spans) {
    for (const SlotSpan& s : spans) {
      if (s.count == 0 || s.first >= imp.token_slots ||
          s.count > imp.token_slots - s.first) {
        return false;
      }
    }
    return true;
  };
  if (!in_range(src) || !in_range(dst)) return;
  if (std::set<uint64_t>(dst_rows.begin(), dst_rows.end()).size() != tokens)
    return;

  const uint32_t lb =
      fdp_->ConsumeIntegralInRange<uint32_t>(0, g.num_layers - 1);
  const uint32_t le =
      fdp_->ConsumeIntegralInRange<uint32_t>(lb + 1, g.num_layers);
  const uint64_t stride = g.token_stride();
  auto row = [&](uint32_t kv, uint32_t l, uint64_t t) {
    return imp.data + imp.offsets[kv][l] + t * stride;
  };
  // Fill source rows with a pattern; remember them.
  const uint8_t seed = fdp_->ConsumeIntegral<uint8_t>();
  std::vector<uint8_t> expect;
  for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
    for (uint32_t l = lb; l < le; ++l) {
      for (size_t i = 0; i < tokens; ++i) {
        uint8_t* p = row(kv, l, src_rows[i]);
        for (uint64_t b = 0; b < stride; ++b) {
          p[b] = static_cast<uint8_t>(seed + kv * 97 + l * 31 + i * 7 + b);
        }
      }
    }
  }
  for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
    for (uint32_t l = lb; l < le; ++l) {
      for (size_t i = 0; i < tokens; ++i) {
        const uint8_t* p = row(kv, l, src_rows[i]);
        expect.insert(expect.end(), p, p + stride);
      }
    }
  }
  v1::TransferRequest r;
  r.set_session_id(m.id);
  r.set_pool(imp.pool);
  r.set_import_id(imp.id);
  r.set_layer_begin(lb);
  r.set_layer_end(le);
  r.set_mechanism(
      static_cast<v1::CopyMechanism>(fdp_->ConsumeIntegralInRange<int>(0, 2)));
  SetRuns(runs, r.mutable_host_pages());
  for (const SlotSpan& s : src) {
    v1::SlotRun* d = r.add_device_slots();
    d->set_first_slot(s.first);
    d->set_num_slots(s.count);
  }
  auto backup = handler_.Backup(r);
  FUZZ_CHECK(backup.ok(), "round trip backup: ", backup.status().ToString(),
             " ", r.ShortDebugString());
  AfterTransfer(m.id, /*allow_running=*/false);
  for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
    for (uint32_t l = lb; l < le; ++l) {
      for (size_t i = 0; i < tokens; ++i)
        std::memset(row(kv, l, dst_rows[i]), 0xEE, stride);
    }
  }
  r.clear_device_slots();
  for (const SlotSpan& s : dst) {
    v1::SlotRun* d = r.add_device_slots();
    d->set_first_slot(s.first);
    d->set_num_slots(s.count);
  }
  r.set_mechanism(
      static_cast<v1::CopyMechanism>(fdp_->ConsumeIntegralInRange<int>(0, 2)));
  auto load = handler_.Load(r);
  Note(load.ok());
  if (imp.mapping != nullptr) ++passed_fd_round_trips_;
  FUZZ_CHECK(load.ok(), "round trip load: ", load.status().ToString());
  AfterTransfer(m.id, /*allow_running=*/false);
  size_t at = 0;
  for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
    for (uint32_t l = lb; l < le; ++l) {
      for (size_t i = 0; i < tokens; ++i, at += stride) {
        FUZZ_CHECK(std::memcmp(row(kv, l, dst_rows[i]), expect.data() + at,
                               stride) == 0,
                   "round trip differs: plane ", kv, " layer ", l, " token ", i,
                   " pool ", pool->info().spec().ShortDebugString(),
                   " request ", r.ShortDebugString());
      }
    }
  }
}

}  // namespace hostkv::fuzz
