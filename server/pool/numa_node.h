// The NUMA node of a pool's memory: chosen from a flag or the GPU's PCI
// device (sysfs), and bound with the raw syscalls (mbind, set_mempolicy).
#ifndef HOSTKV_SERVER_POOL_NUMA_NODE_H_
#define HOSTKV_SERVER_POOL_NUMA_NODE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hostkv {

// A kernel list "0-3,8,10-11" as numbers; empty for an empty or bad list.
std::vector<int> ParseNodeList(absl::string_view text);

// What is asked (--numa_node, PoolSpec.numa_node): "auto" (the GPU's node
// on the CUDA backend, when the machine has more than one), "none", or a
// node number. kNoNode (-1) stands for none.
inline constexpr int kNoNode = -1;
struct NumaRequest {
  bool automatic = false;
  int node = kNoNode;  // when not automatic
};
// InvalidArgument for anything but auto, none or 0..1023.
absl::StatusOr<NumaRequest> ParseNumaRequest(absl::string_view text);

// The node a pool's memory goes on, with the machine described under
// `sysfs_root` ("/sys"): an explicit node must be online (InvalidArgument
// naming the online ones); auto takes the node of the PCI device
// `gpu_pci_bus_id` (bus/pci/devices/<id>/numa_node; empty id: no GPU),
// kNoNode when there is no GPU, the kernel does not know (-1) or only one
// node is online (nothing to choose).
absl::StatusOr<int> ChooseNumaNode(const NumaRequest& request,
                                   const std::string& sysfs_root,
                                   const std::string& gpu_pci_bus_id);

// Binds the pages of [p, p + bytes) (a shared mapping: the policy is the
// file's) to `node` (mbind MPOL_BIND) before any of them is allocated.
// Internal with the errno otherwise.
absl::Status BindRangeToNode(uint8_t* p, uint64_t bytes, int node);

// Runs the calling thread on `node`'s CPUs (those of them it may use; all
// it may use if none) and allocates its memory there (set_mempolicy).
absl::Status BindThreadToNode(const std::string& sysfs_root, int node);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_NUMA_NODE_H_
