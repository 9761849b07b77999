// Where a pool's memory goes: the NUMA node chosen from a flag or the GPU's
// PCI device on a described machine (a fake sysfs), the binding itself on
// node 0 of this one, and the hugepage plan from what the kernel offers.
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "proto/contract/shm_segment.h"
#include "server/pool/huge_pages.h"
#include "server/pool/numa_node.h"
#include "server/pool/resident_range.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

namespace fs = std::filesystem;

// A sysfs tree in a temp dir: Write("devices/system/node/online", "0-1").
class FakeSysfs {
 public:
  FakeSysfs() {
    char tmpl[] = "/tmp/hostkv-sysfs-XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  void Write(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(root_ + "/" + path).parent_path());
    std::ofstream(root_ + "/" + path) << text << "\n";
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

TEST(NumaNodeTest, ParsesKernelLists) {
  EXPECT_EQ(ParseNodeList("0"), (std::vector<int>{0}));
  EXPECT_EQ(ParseNodeList("0-2,5,7-8\n"), (std::vector<int>{0, 1, 2, 5, 7, 8}));
  EXPECT_TRUE(ParseNodeList("").empty());
  EXPECT_TRUE(ParseNodeList("3-1").empty());
  EXPECT_TRUE(ParseNodeList("a").empty());
}

TEST(NumaNodeTest, ParsesRequests) {
  ASSIGN_OR_FAIL(a, ParseNumaRequest("auto"));
  EXPECT_TRUE(a.automatic);
  ASSIGN_OR_FAIL(none, ParseNumaRequest("none"));
  EXPECT_FALSE(none.automatic);
  EXPECT_EQ(none.node, kNoNode);
  ASSIGN_OR_FAIL(one, ParseNumaRequest("1"));
  EXPECT_EQ(one.node, 1);
  EXPECT_ERROR(InvalidArgument, ParseNumaRequest("-1"));
  EXPECT_ERROR(InvalidArgument, ParseNumaRequest("node1"));
  EXPECT_ERROR(InvalidArgument, ParseNumaRequest("4096"));
}

TEST(NumaNodeTest, AutoTakesTheGpusNodeOnATwoNodeMachine) {
  FakeSysfs sys;
  sys.Write("devices/system/node/online", "0-1");
  sys.Write("bus/pci/devices/0000:3b:00.0/numa_node", "1");
  sys.Write("bus/pci/devices/0000:af:00.0/numa_node", "-1");
  const NumaRequest automatic{true, kNoNode};
  // CUDA spells the bus id in upper case; sysfs in lower.
  ASSIGN_OR_FAIL(node, ChooseNumaNode(automatic, sys.root(), "0000:3B:00.0"));
  EXPECT_EQ(node, 1);
  // The kernel does not know the device's node, there is no GPU, or no
  // such device: unbound.
  ASSIGN_OR_FAIL(unknown, ChooseNumaNode(automatic, sys.root(), "0000:AF:00.0"));
  EXPECT_EQ(unknown, kNoNode);
  ASSIGN_OR_FAIL(no_gpu, ChooseNumaNode(automatic, sys.root(), ""));
  EXPECT_EQ(no_gpu, kNoNode);
  ASSIGN_OR_FAIL(missing, ChooseNumaNode(automatic, sys.root(), "0000:01:00.0"));
  EXPECT_EQ(missing, kNoNode);
  // An explicit node must be online.
  ASSIGN_OR_FAIL(zero, ChooseNumaNode(NumaRequest{false, 0}, sys.root(), "0000:3B:00.0"));
  EXPECT_EQ(zero, 0);
  EXPECT_ERROR(InvalidArgument, ChooseNumaNode(NumaRequest{false, 2}, sys.root(), ""));
  ASSIGN_OR_FAIL(none, ChooseNumaNode(NumaRequest{false, kNoNode}, sys.root(), "0000:3B:00.0"));
  EXPECT_EQ(none, kNoNode);
}

TEST(NumaNodeTest, AutoBindsNothingOnAOneNodeMachine) {
  FakeSysfs sys;
  sys.Write("devices/system/node/online", "0");
  sys.Write("bus/pci/devices/0000:3b:00.0/numa_node", "0");
  ASSIGN_OR_FAIL(node, ChooseNumaNode(NumaRequest{true, kNoNode}, sys.root(), "0000:3b:00.0"));
  EXPECT_EQ(node, kNoNode);
}

TEST(NumaNodeTest, BindsASegmentAndAThreadToNodeZero) {
  absl::StatusOr<ShmSegment> segment = ShmSegment::CreateSealed("numa-test", 8 << 20, false);
  ASSERT_OK(segment);
  ASSERT_OK(BindRangeToNode(segment->data(), segment->size(), 0));
  ResidentMethod method;
  ASSERT_OK(MakeResident(segment->data(), {0, 8 << 20}, segment->fd(), &method));
  int mode = -1;
  unsigned long mask[16] = {0};
  ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, mask, 1024, segment->data(),
                    2 /*MPOL_F_ADDR*/), 0);
  EXPECT_EQ(mode, 2 /*MPOL_BIND*/);
  EXPECT_EQ(mask[0], 1ul);
  int node = -1;
  ASSERT_EQ(syscall(SYS_get_mempolicy, &node, nullptr, 0,
                    segment->data() + (5 << 20), 3 /*MPOL_F_NODE|MPOL_F_ADDR*/), 0);
  EXPECT_EQ(node, 0);
  std::thread([] {
    ASSERT_OK(BindThreadToNode("/sys", 0));
    int mode = -1;
    unsigned long mask[16] = {0};
    ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, mask, 1024, nullptr, 0), 0);
    EXPECT_EQ(mode, 2 /*MPOL_BIND*/);
    EXPECT_EQ(mask[0], 1ul);
  }).join();
  // A node that is not there.
  EXPECT_ERROR(Internal, BindRangeToNode(segment->data(), segment->size(), 1000));
}

TEST(HugePagesTest, ParsesModes) {
  ASSIGN_OR_FAIL(a, ParseHugePageMode("auto"));
  EXPECT_EQ(a, HugePageMode::kAuto);
  ASSIGN_OR_FAIL(b, ParseHugePageMode("2M"));
  EXPECT_EQ(b, HugePageMode::k2M);
  ASSIGN_OR_FAIL(c, ParseHugePageMode("1gib"));
  EXPECT_EQ(c, HugePageMode::k1G);
  ASSIGN_OR_FAIL(d, ParseHugePageMode("OFF"));
  EXPECT_EQ(d, HugePageMode::kOff);
  EXPECT_ERROR(InvalidArgument, ParseHugePageMode("4M"));
}

TEST(HugePagesTest, ReadsWhatTheKernelOffers) {
  FakeSysfs sys;
  sys.Write("kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "300");
  sys.Write("kernel/mm/transparent_hugepage/shmem_enabled",
            "always within_size [advise] never deny force");
  const HugePageSystem s = ReadHugePageSystem(sys.root());
  EXPECT_EQ(s.free_2m, 300u);
  EXPECT_EQ(s.free_1g, 0u);
  EXPECT_EQ(s.shmem_thp, "advise");
}

TEST(HugePagesTest, PlansFromWhatIsFree) {
  const uint64_t bytes = (100ull << 20) + 1;  // 51 pages of 2 MiB, 1 of 1 GiB
  HugePageSystem none{0, 0, "never"};
  ASSIGN_OR_FAIL(plan, PlanHugePages(HugePageMode::kAuto, bytes, none));
  EXPECT_EQ(plan.used, "4K");
  EXPECT_EQ(plan.memfd_flags, 0u);
  absl::StatusOr<HugePagePlan> short_2m = PlanHugePages(HugePageMode::k2M, bytes, none);
  EXPECT_ERROR(ResourceExhausted, short_2m);
  EXPECT_NE(std::string(short_2m.status().message()).find("vm.nr_hugepages by at least 51"),
            std::string::npos)
      << short_2m.status();
  absl::StatusOr<HugePagePlan> short_1g = PlanHugePages(HugePageMode::k1G, bytes, none);
  EXPECT_NE(std::string(short_1g.status().message()).find("hugepages-1048576kB/nr_hugepages"),
            std::string::npos);
  HugePageSystem enough{51, 1, "advise"};
  ASSIGN_OR_FAIL(two, PlanHugePages(HugePageMode::kAuto, bytes, enough));
  EXPECT_EQ(two.used, "2M");
  EXPECT_EQ(two.page_bytes, 2u << 20);
  EXPECT_NE(two.memfd_flags, 0u);
  ASSIGN_OR_FAIL(one_g, PlanHugePages(HugePageMode::k1G, bytes, enough));
  EXPECT_EQ(one_g.used, "1G");
  HugePageSystem thp{50, 0, "advise"};  // one 2 MiB page short: THP
  ASSIGN_OR_FAIL(t, PlanHugePages(HugePageMode::kAuto, bytes, thp));
  EXPECT_EQ(t.used, "thp");
  EXPECT_TRUE(t.madvise_thp);
  ASSIGN_OR_FAIL(off, PlanHugePages(HugePageMode::kOff, bytes, enough));
  EXPECT_EQ(off.used, "4K");
}

TEST(HugePagesTest, AHugetlbSegmentIsSealedOrShortOfPagesClearly) {
  const HugePageSystem system = ReadHugePageSystem();
  absl::StatusOr<ShmSegment> segment =
      ShmSegment::CreateSealed("huge-test", 4 << 20, false, MFD_HUGETLB);
  if (system.free_2m < 2) {
    // No hugetlb pages here: mmap's reservation fails, cleanly.
    EXPECT_ERROR(ResourceExhausted, segment);
    return;
  }
  ASSERT_OK(segment);
  // The seals the daemon relies on hold on a hugetlb memfd too.
  ASSIGN_OR_FAIL(adopted, ShmSegment::AdoptSealed(ScopedFd(dup(segment->fd())),
                                                  "huge-test", 4 << 20));
  EXPECT_EQ(adopted.size(), 4u << 20);
}

}  // namespace
}  // namespace hostkv
