// tenant_client's page-cache commands (tenant_client.cc runs them as
// another uid for the multi-user suite):
//   publish POOL NAMESPACE PAGES BYTE  (pages filled with BYTE, keys k0..,
//                                      each the parent of the next)
//   lookup POOL NAMESPACE PAGES        ("hits H bytes B value V": V is the
//                                      byte of every page read, or "mixed")
// Both exit with the absl status code they got.
#ifndef HOSTKV_TESTS_E2E_TENANT_CACHE_COMMANDS_H_
#define HOSTKV_TESTS_E2E_TENANT_CACHE_COMMANDS_H_

#include <cstdint>
#include <string>

#include "hostkv/client.h"

namespace hostkv {

int PublishPages(Client& client, const std::string& pool,
                 const std::string& name_space, uint64_t pages, uint8_t byte);
int LookupPages(Client& client, const std::string& pool,
                const std::string& name_space, uint64_t pages);

}  // namespace hostkv

#endif  // HOSTKV_TESTS_E2E_TENANT_CACHE_COMMANDS_H_
