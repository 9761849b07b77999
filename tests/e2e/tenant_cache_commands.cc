#include "tests/e2e/tenant_cache_commands.h"

#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"

namespace hostkv {
namespace {

int Report(const absl::Status& status) {
  std::printf("%s\n", status.ToString().c_str());
  std::fflush(stdout);
  return static_cast<int>(status.code());
}

std::string Key(uint64_t i) { return absl::StrCat("k", i); }

}  // namespace

int PublishPages(Client& client, const std::string& pool,
                 const std::string& name_space, uint64_t pages, uint8_t byte) {
  absl::StatusOr<v1::Pool> info = client.GetPool(pool);
  if (!info.ok()) return Report(info.status());
  absl::StatusOr<std::vector<PageRange>> runs =
      client.Alloc(pool, pages * info->spec().page_size());
  if (!runs.ok()) return Report(runs.status());
  const std::string data(pages * info->page_bytes(), static_cast<char>(byte));
  if (absl::Status s = client.WritePages(pool, *runs, data); !s.ok()) {
    return Report(s);
  }
  std::vector<CacheItem> items;
  for (const PageRange& run : *runs) {
    for (uint64_t p = 0; p < run.num_pages; ++p) {
      const uint64_t i = items.size();
      items.push_back({Key(i), i == 0 ? "" : Key(i - 1), run.first_page + p});
    }
  }
  absl::StatusOr<PublishOutcomes> published =
      client.Publish(pool, name_space, items);
  if (!published.ok()) return Report(published.status());
  std::printf("cached %llu already %llu\n",
              static_cast<unsigned long long>(published->cached),
              static_cast<unsigned long long>(published->already_cached));
  return Report(absl::OkStatus());
}

int LookupPages(Client& client, const std::string& pool,
                const std::string& name_space, uint64_t pages) {
  std::vector<std::string> keys;
  for (uint64_t i = 0; i < pages; ++i) keys.push_back(Key(i));
  absl::StatusOr<LookupResult> found =
      client.Lookup(pool, name_space, keys, /*acquire=*/true);
  if (!found.ok()) return Report(found.status());
  std::string data;
  if (found->hits > 0) {
    absl::StatusOr<std::string> read = client.ReadPages(pool, found->pages);
    if (!read.ok()) return Report(read.status());
    data = *std::move(read);
  }
  std::string value = data.empty() ? "none" : absl::StrCat(
      static_cast<unsigned>(static_cast<uint8_t>(data[0])));
  for (char c : data) {
    if (c != data[0]) value = "mixed";
  }
  std::printf("hits %llu bytes %zu value %s\n",
              static_cast<unsigned long long>(found->hits), data.size(),
              value.c_str());
  return Report(absl::OkStatus());
}

}  // namespace hostkv
