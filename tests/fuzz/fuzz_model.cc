#include "tests/fuzz/fuzz_model.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_check.h"

namespace hostkv::fuzz {

void Die(const std::string& what) {
  std::fprintf(stderr, "request_fuzzer: invariant violated: %s\n",
               what.c_str());
  std::fflush(stderr);
  std::abort();
}

RequestLimits MakeLimits(const std::string& prefix) {
  RequestLimits limits;
  limits.max_page_io_bytes = kMaxPageIoBytes;
  limits.reserved_segment_prefix = prefix;
  // As deployed: shm buffers only for sessions attached by a peer whose uid
  // owns the segments (AttachSession stands in for the session socket).
  limits.allow_unverified_shm_names = false;
  return limits;
}

v1::PoolSpec BaseSpec(int which) {
  v1::PoolSpec spec;
  spec.set_name(kBasePools[which]);
  if (which == 0) {  // MHA page_first, 2 layers x 2 heads x 4, bf16, 101 pages
    spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
    auto* mha = spec.mutable_geometry()->mutable_mha();
    mha->set_num_layers(2);
    mha->set_num_kv_heads(2);
    mha->set_head_dim(4);
    spec.set_page_size(4);
    spec.set_layout(v1::LAYOUT_PAGE_FIRST);
    spec.set_capacity_tokens(400);
  } else {  // MLA layer_first, 3 layers x (4 + 2), fp16, 151 pages
    spec.mutable_geometry()->set_dtype(v1::DTYPE_FP16);
    auto* mla = spec.mutable_geometry()->mutable_mla();
    mla->set_num_layers(3);
    mla->set_kv_lora_rank(4);
    mla->set_qk_rope_head_dim(2);
    spec.set_page_size(2);
    spec.set_layout(v1::LAYOUT_LAYER_FIRST);
    spec.set_capacity_tokens(300);
    spec.set_default_mechanism(v1::MECHANISM_KERNEL);
  }
  return spec;
}

std::vector<PageRun> ToRuns(
    const google::protobuf::RepeatedPtrField<v1::PageRun>& in) {
  std::vector<PageRun> out;
  for (const v1::PageRun& r : in)
    out.push_back({r.first_page(), r.num_pages()});
  return out;
}

}  // namespace hostkv::fuzz
