#include "tests/gpu/gpu_bench_baselines.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "tests/bench/bench_util.h"
#include "tests/gpu/gpu_bench_common.h"
#include "tests/gpu/gpu_engine.h"
#include "tests/gpu/scatter_baseline.h"

namespace hostkv::gpu_bench {
namespace {

using bench::Samples;
using gpu_testing::CudaStream;
using gpu_testing::DeviceMemory;

}  // namespace

// Median time of `reps` contiguous cudaMemcpyAsync calls, after a warm-up.
double CopyMs(void* dst, const void* src, uint64_t bytes, cudaStream_t stream,
              int reps) {
  cudaEvent_t start, end;
  CheckCuda(cudaEventCreate(&start), "cudaEventCreate");
  CheckCuda(cudaEventCreate(&end), "cudaEventCreate");
  Samples ms;
  for (int i = 0; i <= reps; ++i) {
    CheckCuda(cudaEventRecord(start, stream), "cudaEventRecord");
    CheckCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream),
              "cudaMemcpyAsync");
    CheckCuda(cudaEventRecord(end, stream), "cudaEventRecord");
    CheckCuda(cudaEventSynchronize(end), "cudaEventSynchronize");
    float elapsed = 0;
    CheckCuda(cudaEventElapsedTime(&elapsed, start, end),
              "cudaEventElapsedTime");
    if (i > 0) ms.Add(elapsed);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  return ms.Median();
}

// The scatter baselines of `b` (see Baseline): every layer's pieces from
// `host` (pinned, b->bytes) into `device` (b->bytes) at shuffled pages.
void MeasureScatter(const Model& m, uint64_t tokens, int reps, void* host,
                    void* device, cudaStream_t stream, Baseline* b) {
  const uint64_t pages = tokens / kPageSize;
  const uint64_t piece = kPageSize * m.row_bytes();
  const uint64_t per_layer = pages * m.planes();
  std::vector<uint64_t> perm(pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(7));
  std::vector<uint64_t> src(per_layer * m.layers), dst(src.size());
  for (uint64_t i = 0; i < src.size(); ++i) {
    const uint64_t block = i / pages, page = i % pages;  // (layer, plane), page
    src[i] = i * piece;
    dst[i] = (block * pages + perm[page]) * piece;
  }
  b->pieces = src.size();
  DeviceMemory offsets = Check(
      DeviceMemory::Allocate(2 * src.size() * sizeof(uint64_t)), "offsets");
  auto* src_dev = reinterpret_cast<uint64_t*>(offsets.data());
  uint64_t* dst_dev = src_dev + src.size();
  CheckCuda(cudaMemcpy(src_dev, src.data(), src.size() * 8, cudaMemcpyHostToDevice),
            "offsets");
  CheckCuda(cudaMemcpy(dst_dev, dst.data(), dst.size() * 8, cudaMemcpyHostToDevice),
            "offsets");
  const auto* h = static_cast<const uint8_t*>(host);
  auto* d = static_cast<uint8_t*>(device);
  auto time = [&](auto&& enqueue_layer) {
    cudaEvent_t start, end;
    CheckCuda(cudaEventCreate(&start), "cudaEventCreate");
    CheckCuda(cudaEventCreate(&end), "cudaEventCreate");
    Samples ms;
    bool ok = true;
    for (int i = 0; i <= reps && ok; ++i) {
      CheckCuda(cudaEventRecord(start, stream), "cudaEventRecord");
      for (uint32_t l = 0; l < m.layers && ok; ++l) ok = enqueue_layer(l);
      CheckCuda(cudaEventRecord(end, stream), "cudaEventRecord");
      CheckCuda(cudaEventSynchronize(end), "cudaEventSynchronize");
      float elapsed = 0;
      CheckCuda(cudaEventElapsedTime(&elapsed, start, end), "cudaEventElapsedTime");
      if (i > 0) ms.Add(elapsed);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(end);
    return ok ? Gbps(b->bytes, ms.Median()) : 0.0;
  };
  b->scatter_kernel_h2d_gbps = time([&](uint32_t l) {
    CheckCuda(gpu_testing::LaunchPieceCopyKernel(
                  h, src_dev + l * per_layer, d, dst_dev + l * per_layer, piece,
                  per_layer, stream),
              "the scatter kernel");
    return true;
  });
  std::vector<void*> dsts(per_layer), srcs(per_layer);
  std::vector<size_t> sizes(per_layer, piece);
  b->scatter_batch_h2d_gbps = time([&](uint32_t l) {
    for (uint64_t i = 0; i < per_layer; ++i) {
      dsts[i] = d + dst[l * per_layer + i];
      srcs[i] = const_cast<uint8_t*>(h) + src[l * per_layer + i];
    }
    cudaMemcpyAttributes attrs{};
    attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attrs_index = 0;
    const cudaError_t error =
        cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), per_layer,
                             &attrs, &attrs_index, 1, stream);
    if (error == cudaErrorNotSupported ||
        error == cudaErrorCallRequiresNewerDriver) {
      cudaGetLastError();
      return false;
    }
    CheckCuda(error, "cudaMemcpyBatchAsync");
    return true;
  });
}

Baseline MeasureBaseline(const Model& m, uint64_t tokens, int reps) {
  Baseline b;
  b.model = m.label;
  b.bytes = m.op_bytes(tokens);
  b.layer_bytes = b.bytes / m.layers;
  void* host = nullptr;
  CheckCuda(cudaHostAlloc(&host, b.bytes, cudaHostAllocMapped),
            "cudaHostAlloc");  // mapped: the scatter kernel reads it (UVA)
  std::memset(host, 1, b.bytes);
  DeviceMemory device =
      Check(DeviceMemory::Allocate(b.bytes), "baseline buffer");
  CudaStream stream = Check(CudaStream::Create(), "stream");
  b.h2d_gbps =
      Gbps(b.bytes, CopyMs(device.data(), host, b.bytes, stream.get(), reps));
  b.d2h_gbps =
      Gbps(b.bytes, CopyMs(host, device.data(), b.bytes, stream.get(), reps));
  b.layer_h2d_ms =
      CopyMs(device.data(), host, b.layer_bytes, stream.get(), reps);
  MeasureScatter(m, tokens, reps, host, device.data(), stream.get(), &b);
  cudaFreeHost(host);
  return b;
}

}  // namespace hostkv::gpu_bench
