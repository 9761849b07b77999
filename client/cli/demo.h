// `hostkv demo`: moves KV pages through a running hostkvd and checks every
// byte, so a newcomer sees the whole data path work.
#ifndef HOSTKV_CLIENT_CLI_DEMO_H_
#define HOSTKV_CLIENT_CLI_DEMO_H_

#include <cstdint>
#include <string>

#include "hostkv/client.h"

namespace hostkv {

struct DemoOptions {
  std::string pool = "demo";
  std::string attention = "mha";  // mha or mla
  std::string layout = "page_first";
  uint32_t page_size = 16;
  uint32_t layers = 4;
  uint32_t heads = 2;       // MHA kv heads
  uint32_t head_dim = 64;   // MHA head_dim; MLA kv_lora_rank + rope dim
  uint64_t tokens = 256;    // tokens moved
  uint64_t capacity_tokens = 4096;
};

// Creates (or attaches) the pool, backs up a known pattern from shared-
// memory "device" buffers, clears them, loads the pages back layer by
// layer, verifies every byte, prints what it did and the pool's occupancy,
// and frees what it took. Returns a process exit code: 0 if every byte
// matched.
int RunDemo(Client& client, const DemoOptions& options);

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_CLI_DEMO_H_
