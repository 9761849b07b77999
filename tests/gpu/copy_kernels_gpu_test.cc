// The copy kernel on the GPU moves the same bytes as its CPU emulation
// (RunKernelCopyOnCpu, which kernel_copy_plan_test checks against the
// reference layout model), for every layout, page size, MHA/MLA and
// direction, with the host pool in mapped pinned memory reached through UVA.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/copy_plan.h"
#include "kernels/cuda/copy_kernels.h"
#include "kernels/cuda/layout_kernels.h"
#include "kernels/kernel_copy_plan.h"
#include "tests/kernels/byte_compare.h"
#include "tests/kernels/reference_layout.h"

namespace hostkv {
namespace {

using reference::PatternBuffer;
using reference::PoolSpec;

#define ASSERT_CUDA(expr) ASSERT_EQ(cudaSuccess, (expr)) << #expr

// Owners of the CUDA allocations and the stream.
struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct CudaFreeHost {
  void operator()(void* p) const { cudaFreeHost(p); }
};
using DeviceBuffer = std::unique_ptr<uint8_t, CudaFree>;
using PinnedBuffer = std::unique_ptr<uint8_t, CudaFreeHost>;
struct Stream {
  cudaStream_t stream = nullptr;
  ~Stream() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

// Allocates `bytes` of device memory holding `data`.
void Upload(const void* data, uint64_t bytes, DeviceBuffer* out) {
  void* p = nullptr;
  ASSERT_CUDA(cudaMalloc(&p, bytes));
  out->reset(static_cast<uint8_t*>(p));
  ASSERT_CUDA(cudaMemcpy(p, data, bytes, cudaMemcpyHostToDevice));
}


// Host pages scattered and out of order, device runs not page aligned, in a
// 5-page pool and 8 pages + 4 device slots.
constexpr uint64_t kHostPages = 5;
std::vector<TokenRun> Runs(uint64_t ps) {
  return ZipRuns({{3 * ps, ps}, {0, ps}, {4 * ps, ps}, {ps, ps}},
                 {{4 * ps + 3, 2 * ps}, {1, 2 * ps}});
}

// Copies Runs() of every layer of `spec` on the GPU and on the CPU, from the
// same starting bytes, and compares the host pool and every device buffer.
void ExpectGpuMatchesCpu(const PoolSpec& spec, CopyDirection direction,
                         unsigned max_blocks) {
  SCOPED_TRACE(std::string(direction == CopyDirection::kHostToDevice
                               ? "load"
                               : "backup") +
               " max_blocks " + std::to_string(max_blocks));
  const PoolGeometry g = reference::ToGeometry(spec);
  const uint64_t host_bytes = g.total_bytes();
  const uint64_t plane_bytes = (8 * spec.page_size + 4) * g.token_stride();
  const uint32_t planes = g.kv_planes();

  // The CPU twin: pool and planes[layer * 2 + kv].
  std::vector<uint8_t> cpu_host = PatternBuffer(host_bytes, 7);
  std::vector<std::vector<uint8_t>> cpu_planes(2 * g.num_layers);
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    for (uint32_t kv = 0; kv < planes; ++kv) {
      cpu_planes[2 * l + kv] = PatternBuffer(plane_bytes, 100 + 2 * l + kv);
    }
  }

  // The GPU side: mapped pinned pool, device planes and token arrays.
  void* pinned = nullptr;
  ASSERT_CUDA(cudaHostAlloc(&pinned, host_bytes, cudaHostAllocMapped));
  PinnedBuffer host(static_cast<uint8_t*>(pinned));
  std::memcpy(host.get(), cpu_host.data(), host_bytes);
  void* host_on_device = nullptr;
  ASSERT_CUDA(cudaHostGetDevicePointer(&host_on_device, pinned, 0));
  std::vector<DeviceBuffer> gpu_planes(2 * g.num_layers);
  for (size_t i = 0; i < cpu_planes.size(); ++i) {
    if (cpu_planes[i].empty()) continue;
    ASSERT_NO_FATAL_FAILURE(
        Upload(cpu_planes[i].data(), plane_bytes, &gpu_planes[i]));
  }
  const TokenIndex index = BuildTokenIndex(Runs(spec.page_size));
  const uint64_t n = index.host_tokens.size();
  DeviceBuffer gpu_host_tokens, gpu_device_tokens;
  ASSERT_NO_FATAL_FAILURE(
      Upload(index.host_tokens.data(), n * sizeof(uint64_t), &gpu_host_tokens));
  ASSERT_NO_FATAL_FAILURE(Upload(index.device_tokens.data(),
                                 n * sizeof(uint64_t), &gpu_device_tokens));
  Stream stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream.stream, cudaStreamNonBlocking));

  for (uint32_t l = 0; l < g.num_layers; ++l) {
    KernelCopyArgs cpu{g,
                       cpu_host.data(),
                       {cpu_planes[2 * l].data(),
                        planes == 2 ? cpu_planes[2 * l + 1].data() : nullptr},
                       index.host_tokens.data(),
                       index.device_tokens.data(),
                       n,
                       l,
                       direction};
    KernelCopyArgs gpu = cpu;
    gpu.host_base = static_cast<uint8_t*>(host_on_device);
    gpu.device_plane[0] = gpu_planes[2 * l].get();
    gpu.device_plane[1] = gpu_planes[2 * l + 1].get();
    gpu.host_tokens = reinterpret_cast<const uint64_t*>(gpu_host_tokens.get());
    gpu.device_tokens =
        reinterpret_cast<const uint64_t*>(gpu_device_tokens.get());
    ASSERT_EQ(0, LaunchLayerCopyKernel(gpu, max_blocks, stream.stream))
        << "layer " << l;
    RunKernelCopyOnCpu(cpu);
  }
  ASSERT_CUDA(cudaStreamSynchronize(stream.stream));

  EXPECT_TRUE(SameBytes("host pool", cpu_host.data(), host.get(), host_bytes));
  std::vector<uint8_t> downloaded(plane_bytes);
  for (size_t i = 0; i < cpu_planes.size(); ++i) {
    if (cpu_planes[i].empty()) continue;
    ASSERT_CUDA(cudaMemcpy(downloaded.data(), gpu_planes[i].get(), plane_bytes,
                           cudaMemcpyDeviceToHost));
    EXPECT_TRUE(SameBytes("device layer " + std::to_string(i / 2) + " plane " +
                              std::to_string(i % 2),
                          cpu_planes[i].data(), downloaded.data(),
                          plane_bytes));
  }
}

// Every layout and page size; head sizes that take each vector width, and
// rows long enough (3200 bytes) for the kernel's unrolled loop.
std::vector<PoolSpec> AllGpuPools() {
  return reference::AllPools(kHostPages, {{3, 2, 8, 2},
                                          {2, 3, 5, 1},
                                          {4, 1, 6, 4},
                                          {2, 3, 3, 2},
                                          {2, 5, 320, 2},
                                          {2, 1, 1600, 2}});
}

class GpuCopyKernelTest : public ::testing::TestWithParam<PoolSpec> {};

TEST_P(GpuCopyKernelTest, MatchesTheCpuEmulation) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (CopyDirection direction :
       {CopyDirection::kHostToDevice, CopyDirection::kDeviceToHost}) {
    // The default grid, and one block whose warps stride over every row.
    for (unsigned max_blocks : {0u, 1u}) {
      ASSERT_NO_FATAL_FAILURE(
          ExpectGpuMatchesCpu(GetParam(), direction, max_blocks));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, GpuCopyKernelTest,
                         ::testing::ValuesIn(AllGpuPools()),
                         [](const ::testing::TestParamInfo<PoolSpec>& info) {
                           return reference::SpecName(info.param);
                         });

TEST(GpuCopyKernelLaunchTest, EmptyCopyLaunchesNothing) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  KernelCopyArgs args{};
  args.geometry.num_layers = 1;
  args.geometry.page_size = 1;
  args.num_tokens = 0;  // every pointer null: nothing may be touched
  EXPECT_EQ(0, LaunchLayerCopyKernel(args, 0, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
}

TEST(GpuCopyKernelLaunchTest, MissingPointersAndBadLayerAreRejected) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t token = 0;
  uint8_t byte = 0;  // never dereferenced: every call is refused first
  KernelCopyArgs good{};
  good.geometry.attention = Attention::kMha;
  good.geometry.num_layers = 2;
  good.geometry.num_heads = 1;
  good.geometry.head_bytes = 1;
  good.geometry.page_size = 1;
  good.geometry.token_slots = 1;
  good.host_base = &byte;
  good.device_plane[0] = &byte;
  good.device_plane[1] = &byte;
  good.host_tokens = &token;
  good.device_tokens = &token;
  good.num_tokens = 1;
  KernelCopyArgs no_v = good;
  no_v.device_plane[1] = nullptr;  // MHA needs V
  KernelCopyArgs bad_layer = good;
  bad_layer.layer = 2;
  KernelCopyArgs no_index = good;
  no_index.device_tokens = nullptr;
  for (const KernelCopyArgs& a : {no_v, bad_layer, no_index}) {
    EXPECT_EQ(static_cast<int>(cudaErrorInvalidValue),
              LaunchLayerCopyKernel(a, 0, nullptr));
  }
}

}  // namespace
}  // namespace hostkv
