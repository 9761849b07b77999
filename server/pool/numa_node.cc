#include "server/pool/numa_node.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace hostkv {
namespace {

constexpr int kMpolBind = 2;  // linux/mempolicy.h
constexpr int kMaxNode = 1024;

std::string ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

// The nodemask of `node` for the syscalls (kMaxNode bits).
std::vector<unsigned long> MaskOf(int node) {
  std::vector<unsigned long> mask(kMaxNode / (8 * sizeof(unsigned long)), 0);
  mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
  return mask;
}

}  // namespace

std::vector<int> ParseNodeList(absl::string_view text) {
  std::vector<int> out;
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, '-');
    int lo = 0, hi = 0;
    if (ends.size() == 1 && absl::SimpleAtoi(ends[0], &lo)) {
      hi = lo;
    } else if (ends.size() != 2 || !absl::SimpleAtoi(ends[0], &lo) ||
               !absl::SimpleAtoi(ends[1], &hi)) {
      return {};
    }
    if (lo < 0 || hi < lo || hi >= 1 << 16) return {};
    for (int n = lo; n <= hi; ++n) out.push_back(n);
  }
  return out;
}

absl::StatusOr<NumaRequest> ParseNumaRequest(absl::string_view text) {
  NumaRequest r;
  const std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (t == "auto") {
    r.automatic = true;
    return r;
  }
  if (t == "none" || t == "off") return r;
  int node = 0;
  if (absl::SimpleAtoi(t, &node) && node >= 0 && node < kMaxNode) {
    r.node = node;
    return r;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "numa_node '", text, "' is not auto, none or a node number (0..",
      kMaxNode - 1, ")"));
}

absl::StatusOr<int> ChooseNumaNode(const NumaRequest& request,
                                   const std::string& sysfs_root,
                                   const std::string& gpu_pci_bus_id) {
  const std::vector<int> online =
      ParseNodeList(ReadLine(sysfs_root + "/devices/system/node/online"));
  if (!request.automatic) {
    if (request.node == kNoNode) return kNoNode;
    for (int n : online) {
      if (n == request.node) return n;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "NUMA node ", request.node, " is not online (online: ",
        online.empty() ? std::string("unknown") : absl::StrJoin(online, ","), ")"));
  }
  if (gpu_pci_bus_id.empty() || online.size() < 2) return kNoNode;
  // sysfs names PCI devices in lower case ("0000:3b:00.0"); CUDA gives
  // upper case.
  const std::string path = absl::StrCat(sysfs_root, "/bus/pci/devices/",
                                        absl::AsciiStrToLower(gpu_pci_bus_id),
                                        "/numa_node");
  int node = kNoNode;
  if (!absl::SimpleAtoi(ReadLine(path), &node) || node < 0) return kNoNode;
  for (int n : online) {
    if (n == node) return n;
  }
  return kNoNode;
}

absl::Status BindRangeToNode(uint8_t* p, uint64_t bytes, int node) {
  const std::vector<unsigned long> mask = MaskOf(node);
  if (syscall(SYS_mbind, p, bytes, kMpolBind, mask.data(),
              static_cast<unsigned long>(kMaxNode), 0) != 0) {
    return absl::InternalError(absl::StrCat("mbind to NUMA node ", node, ": ",
                                            std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status BindThreadToNode(const std::string& sysfs_root, int node) {
  const std::vector<int> cpus = ParseNodeList(
      ReadLine(absl::StrCat(sysfs_root, "/devices/system/node/node", node, "/cpulist")));
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : cpus) {
      if (cpu < CPU_SETSIZE && CPU_ISSET(cpu, &allowed)) CPU_SET(cpu, &set);
    }
    if (CPU_COUNT(&set) > 0 && sched_setaffinity(0, sizeof(set), &set) != 0) {
      return absl::InternalError(absl::StrCat(
          "binding a thread to NUMA node ", node, "'s CPUs: ", std::strerror(errno)));
    }
  }
  const std::vector<unsigned long> mask = MaskOf(node);
  if (syscall(SYS_set_mempolicy, kMpolBind, mask.data(),
              static_cast<unsigned long>(kMaxNode)) != 0) {
    return absl::InternalError(absl::StrCat("set_mempolicy to NUMA node ", node,
                                            ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace hostkv
