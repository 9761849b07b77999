#include "kernels/pool_geometry.h"

namespace hostkv {

const char* HostLayoutName(HostLayout layout) {
  switch (layout) {
    case HostLayout::kLayerFirst:
      return "layer_first";
    case HostLayout::kPageFirst:
      return "page_first";
    case HostLayout::kPageFirstDirect:
      return "page_first_direct";
    case HostLayout::kPageHead:
      return "page_head";
  }
  return "unknown";
}

}  // namespace hostkv
