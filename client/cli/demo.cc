#include "demo.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "hostkv/shm_device_buffer.h"
#include "stats_table.h"

namespace hostkv {
namespace {

// The byte the demo writes at position i of device row `slot` of `layer`,
// plane `kv`.
uint8_t Pattern(uint32_t kv, uint32_t layer, uint64_t slot, uint64_t i) {
  uint64_t h = (kv + 1) * 0x9E3779B97F4A7C15ull;
  h ^= (layer + 1) * 0xC2B2AE3D27D4EB4Full;
  h ^= (slot + 1) * 0x165667B19E3779F9ull;
  h ^= (i + 1) * 0x27D4EB2F165667C5ull;
  h ^= h >> 29;
  return static_cast<uint8_t>(h * 0xBF58476D1CE4E5B9ull >> 56);
}

absl::StatusOr<v1::PoolSpec> MakeSpec(const DemoOptions& o) {
  v1::PoolSpec spec;
  spec.set_name(o.pool);
  v1::Layout layout;
  if (!v1::Layout_Parse("LAYOUT_" + absl::AsciiStrToUpper(o.layout), &layout)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--layout: '", o.layout,
        "' is not layer_first, page_first, page_first_direct or page_head"));
  }
  spec.set_layout(layout);
  spec.set_page_size(o.page_size);
  spec.set_capacity_tokens(o.capacity_tokens);
  spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  if (o.attention == "mla") {
    v1::MlaGeometry* mla = spec.mutable_geometry()->mutable_mla();
    mla->set_num_layers(o.layers);
    mla->set_kv_lora_rank(o.head_dim * 3 / 4);
    mla->set_qk_rope_head_dim(o.head_dim - o.head_dim * 3 / 4);
  } else if (o.attention == "mha") {
    v1::MhaGeometry* mha = spec.mutable_geometry()->mutable_mha();
    mha->set_num_layers(o.layers);
    mha->set_num_kv_heads(o.heads);
    mha->set_head_dim(o.head_dim);
  } else {
    return absl::InvalidArgumentError("--attention must be mha or mla");
  }
  return spec;
}

int Fail(const char* step, const absl::Status& status) {
  std::fprintf(stderr, "demo: %s failed: %s\n", step, status.ToString().c_str());
  return 1;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

int RunDemo(Client& client, const DemoOptions& o) {
  absl::StatusOr<v1::PoolSpec> spec = MakeSpec(o);
  if (!spec.ok()) return Fail("pool spec", spec.status());
  // The pool goes with the demo's session even if the demo is killed, so a
  // second demo with another geometry finds the name free.
  absl::StatusOr<v1::Pool> pool = client.CreatePool(
      *spec, /*attach_if_exists=*/true, /*delete_with_session=*/true);
  if (!pool.ok()) return Fail("CreatePool", pool.status());
  const uint32_t planes = pool->v_offset() != 0 ? 2 : 1;
  const uint64_t stride = pool->token_stride();
  const uint32_t ps = o.page_size;
  const uint64_t tokens = (o.tokens + ps - 1) / ps * ps;
  // Like SGLang's device pool: page 0 is a dummy page, data starts at ps.
  const uint64_t dev_slots = tokens + ps;
  const uint64_t layer_bytes = dev_slots * stride;
  std::printf("pool '%s': %s, %s, page_size %u, %u layers, %llu token slots, "
              "segment %s\n",
              o.pool.c_str(), planes == 2 ? "MHA" : "MLA", o.layout.c_str(), ps,
              o.layers, static_cast<unsigned long long>(pool->token_slots()),
              pool->segment_name().c_str());

  // A sealed memfd passed over the session socket: no name another user
  // could open, and it cannot shrink under the daemon's copies.
  absl::StatusOr<ShmDeviceBuffer> device =
      ShmDeviceBuffer::CreateSealed(planes * o.layers * layer_bytes);
  if (!device.ok()) return Fail("creating device buffers", device.status());
  absl::StatusOr<uint64_t> handle = client.PassDescriptor(device->fd());
  if (!handle.ok()) return Fail("passing the device buffers", handle.status());
  std::vector<v1::DeviceBuffer> k, v;
  for (uint32_t l = 0; l < o.layers; ++l) {
    k.push_back(ShmDeviceBuffer::DescribePassed(*handle, (planes * l) * layer_bytes,
                                                layer_bytes));
    if (planes == 2) {
      v.push_back(ShmDeviceBuffer::DescribePassed(
          *handle, (planes * l + 1) * layer_bytes, layer_bytes));
    }
  }
  auto at = [&](uint32_t kv, uint32_t l, uint64_t slot) {
    return device->data() + (planes * l + kv) * layer_bytes + slot * stride;
  };
  for (uint32_t kv = 0; kv < planes; ++kv)
    for (uint32_t l = 0; l < o.layers; ++l)
      for (uint64_t s = ps; s < dev_slots; ++s)
        for (uint64_t i = 0; i < stride; ++i) at(kv, l, s)[i] = Pattern(kv, l, s, i);
  std::printf("device buffers: sealed memfd (passed as handle %llu), %u planes "
              "x %u layers x %llu slots, filled with a known pattern\n",
              static_cast<unsigned long long>(*handle), planes, o.layers,
              static_cast<unsigned long long>(dev_slots));

  absl::StatusOr<uint64_t> import =
      client.RegisterDeviceBuffers(o.pool, dev_slots, k, v);
  if (!import.ok()) return Fail("RegisterDeviceBuffers", import.status());
  absl::StatusOr<std::vector<PageRange>> pages = client.Alloc(o.pool, tokens);
  if (!pages.ok()) return Fail("Alloc", pages.status());
  std::printf("alloc %llu tokens -> %zu page run(s), first page %llu\n",
              static_cast<unsigned long long>(tokens), pages->size(),
              static_cast<unsigned long long>(pages->front().first_page));
  const std::vector<SlotRange> slots = {{ps, tokens}};

  absl::Time start = absl::Now();
  absl::StatusOr<Operation> backup = client.Backup(o.pool, *import, *pages, slots);
  if (!backup.ok()) return Fail("Backup", backup.status());
  const absl::Duration enqueue = absl::Now() - start;
  if (absl::Status s = client.Wait(*backup); !s.ok()) return Fail("backup wait", s);
  std::printf("backup: %u layers, %llu bytes, enqueued in %.3f ms, done in %.3f ms\n",
              backup->num_layers, static_cast<unsigned long long>(backup->bytes),
              Ms(enqueue), Ms(absl::Now() - start));

  std::memset(device->data(), 0, device->size());
  std::printf("device buffers cleared\n");

  start = absl::Now();
  absl::StatusOr<Operation> load = client.Load(o.pool, *import, *pages, slots);
  if (!load.ok()) return Fail("Load", load.status());
  uint64_t checked = 0, wrong = 0;
  for (uint32_t l = 0; l < o.layers; ++l) {
    if (absl::Status s = client.WaitLayer(*load, l); !s.ok()) {
      return Fail("load wait", s);
    }
    // Layer l is readable now, while later layers may still be copying.
    for (uint32_t kv = 0; kv < planes; ++kv)
      for (uint64_t s = ps; s < dev_slots; ++s)
        for (uint64_t i = 0; i < stride; ++i, ++checked)
          wrong += at(kv, l, s)[i] != Pattern(kv, l, s, i);
  }
  std::printf("load: %u layers waited one by one and checked, done in %.3f ms\n",
              load->num_layers, Ms(absl::Now() - start));

  absl::StatusOr<std::string> page = client.ReadPages(o.pool, {{pages->front().first_page, 1}});
  if (!page.ok()) return Fail("ReadPages", page.status());
  std::printf("read page %llu in SGLang's flat format: %zu bytes\n",
              static_cast<unsigned long long>(pages->front().first_page),
              page->size());

  absl::StatusOr<v1::GetPoolStatsResponse> stats = client.GetPoolStats(o.pool);
  if (!stats.ok()) return Fail("GetPoolStats", stats.status());
  std::printf("\noccupancy while the demo holds its pages:\n%s\n",
              FormatPoolStats(*stats).c_str());
  absl::StatusOr<uint64_t> freed = client.Free(o.pool, *pages);
  if (!freed.ok()) return Fail("Free", freed.status());
  if (absl::Status s = client.UnregisterDeviceBuffers(*import); !s.ok()) {
    return Fail("UnregisterDeviceBuffers", s);
  }
  std::printf("freed %llu pages, unregistered the device buffers\n",
              static_cast<unsigned long long>(*freed));
  if (absl::Status s = client.DeletePool(o.pool); s.ok()) {
    std::printf("deleted pool '%s'\n", o.pool.c_str());
  } else {  // e.g. another session still uses it: not the demo's failure
    std::printf("pool '%s' kept: %s\n", o.pool.c_str(), s.ToString().c_str());
  }
  if (wrong != 0) {
    std::printf("FAILED: %llu of %llu bytes differ\n",
                static_cast<unsigned long long>(wrong),
                static_cast<unsigned long long>(checked));
    return 1;
  }
  std::printf("OK: all %llu bytes verified after backup -> clear -> load\n",
              static_cast<unsigned long long>(checked));
  return 0;
}

}  // namespace hostkv
