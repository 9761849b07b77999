// Writes pages with the C++ client for the Python client to read back
// (tests/python/test_interop.py): allocates NUM_TOKENS host slots of POOL,
// fills them with WritePages (byte i of the data = (7 * i + 3) mod 256),
// hands them to session TO_SESSION_NUMBER and prints "first count" per run.
//
// usage: cpp_page_writer TARGET POOL NUM_TOKENS TO_SESSION_NUMBER
#include <cstdio>
#include <cstdlib>
#include <string>

#include "hostkv/client.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(
        stderr,
        "usage: cpp_page_writer TARGET POOL NUM_TOKENS TO_SESSION_NUMBER\n");
    return 2;
  }
  const std::string pool = argv[2];
  auto client = hostkv::Client::Connect(argv[1], "cpp-page-writer");
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  auto info = (*client)->GetPool(pool);
  auto pages = (*client)->Alloc(pool, std::strtoull(argv[3], nullptr, 10));
  if (!info.ok() || !pages.ok()) {
    std::fprintf(stderr, "GetPool/Alloc failed\n");
    return 1;
  }
  uint64_t num_pages = 0;
  for (const auto& run : *pages) num_pages += run.num_pages;
  std::string data(num_pages * info->page_bytes(), '\0');
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<char>((7 * i + 3) & 0xff);
  absl::Status written = (*client)->WritePages(pool, *pages, data);
  auto moved = (*client)->HandOverPages(
      pool, *pages, static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 10)));
  if (!written.ok() || !moved.ok()) {
    std::fprintf(stderr, "WritePages/HandOverPages failed: %s %s\n",
                 written.ToString().c_str(), moved.status().ToString().c_str());
    return 1;
  }
  for (const auto& run : *pages) {
    std::printf("%llu %llu\n", static_cast<unsigned long long>(run.first_page),
                static_cast<unsigned long long>(run.num_pages));
  }
  return 0;
}
