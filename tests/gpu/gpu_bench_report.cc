#include "tests/gpu/gpu_bench_report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace hostkv::gpu_bench {

using bench::Num;

const Baseline& Report::BaselineFor(const std::string& model) const {
  for (const Baseline& b : baselines) {
    if (b.model == model) return b;
  }
  return baselines.front();
}

namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x",
                            static_cast<int>(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::string Json(const Report& r) {
  std::string out = "{\n  \"meta\": {";
  for (size_t i = 0; i < r.meta.size(); ++i) {
    absl::StrAppend(&out, i ? ",\n    " : "\n    ", JsonString(r.meta[i].first),
                    ": ", JsonString(r.meta[i].second));
  }
  out += "\n  },\n  \"baselines\": [";
  for (size_t i = 0; i < r.baselines.size(); ++i) {
    const Baseline& b = r.baselines[i];
    absl::StrAppendFormat(
        &out,
        "%s\n    {\"model\": %s, \"bytes\": %d, \"memcpy_h2d_gbps\": %.3f, "
        "\"memcpy_d2h_gbps\": %.3f, \"layer_bytes\": %d, "
        "\"memcpy_layer_h2d_ms\": %.4f, \"scatter_pieces\": %d, "
        "\"scatter_kernel_h2d_gbps\": %.3f, \"scatter_batch_h2d_gbps\": %.3f}",
        i ? "," : "", JsonString(b.model), b.bytes, b.h2d_gbps, b.d2h_gbps,
        b.layer_bytes, b.layer_h2d_ms, b.pieces, b.scatter_kernel_h2d_gbps,
        b.scatter_batch_h2d_gbps);
  }
  out += "\n  ],\n  \"cases\": [";
  for (size_t i = 0; i < r.cases.size(); ++i) {
    const CaseResult& c = r.cases[i];
    const Baseline& b = r.BaselineFor(c.model);
    std::string layers;
    for (double ms : c.layer_ms)
      absl::StrAppendFormat(&layers, "%s%.4f", layers.empty() ? "" : ", ", ms);
    absl::StrAppendFormat(
        &out,
        "%s\n    {\"model\": %s, \"layout\": %s, \"mechanism\": %s, "
        "\"bytes\": %d, \"load_gbps\": %.3f, \"load_ratio\": %.4f, "
        "\"first_layer_ms\": %.4f, \"first_layer_ratio\": %.4f, "
        "\"backup_gbps\": %.3f, \"backup_ratio\": %.4f, "
        "\"load_call_p50_us\": %.2f, \"backup_call_p50_us\": %.2f, "
        "\"load_reps\": %d, \"backup_reps\": %d, \"error\": %s, "
        "\"load_layer_ms\": [%s]}",
        i ? "," : "", JsonString(c.model), JsonString(c.layout),
        JsonString(c.mechanism), c.bytes, c.load_gbps, c.load_gbps / b.h2d_gbps,
        c.first_layer_ms, c.first_layer_ms / b.layer_h2d_ms, c.backup_gbps,
        c.backup_gbps / b.d2h_gbps, c.load_call_us, c.backup_call_us,
        c.load_reps, c.backup_reps, JsonString(c.error), layers);
  }
  const CallCost& k = r.call;
  absl::StrAppendFormat(
      &out,
      "\n  ],\n  \"call_cost\": {\"runs\": %d, \"load_p50_us\": %.2f, "
      "\"load_p90_us\": %.2f, \"get_pool_p50_us\": %.2f, "
      "\"get_pool_p90_us\": %.2f, \"ratio_p50\": %.3f, \"samples\": %d},\n"
      "  \"small_loads\": [",
      k.runs, k.load_us.Median(), k.load_us.Percentile(90),
      k.get_pool_us.Median(), k.get_pool_us.Percentile(90),
      k.get_pool_us.Median() > 0 ? k.load_us.Median() / k.get_pool_us.Median()
                                 : 0,
      static_cast<int>(k.load_us.size()));
  for (size_t i = 0; i < r.small_loads.size(); ++i) {
    const SmallLoad& s = r.small_loads[i];
    absl::StrAppendFormat(
        &out,
        "%s{\"pages\": %d, \"first_layer_p50_us\": %.2f, "
        "\"first_layer_p99_us\": %.2f, \"call_p50_us\": %.2f, "
        "\"samples\": %d}",
        i ? ", " : "", s.pages, s.first_layer_us.Median(),
        s.first_layer_us.Percentile(99), s.call_us.Median(),
        static_cast<int>(s.first_layer_us.size()));
  }
  out += "],\n  \"notes\": [";
  for (size_t i = 0; i < r.notes.size(); ++i) {
    absl::StrAppend(&out, i ? ", " : "", JsonString(r.notes[i]));
  }
  return out + "]\n}\n";
}

std::string Markdown(const Report& r) {
  std::string out = "# hostkv GPU data path\n\n";
  for (const auto& [k, v] : r.meta)
    absl::StrAppend(&out, "- ", k, ": ", v, "\n");
  out +=
      "\nGB/s are timed on the GPU, from an event on the engine's stream "
      "before the Load/Backup call to an event after "
      "GpuSignals::WaitLayer(last layer) on that stream: the call and the "
      "daemon's dispatch are included. Medians after one warm-up. The "
      "baseline is one contiguous cudaMemcpyAsync of the same bytes between "
      "pinned host memory and the device, in this process, in this run.\n\n"
      "## Baselines\n\n| model | bytes | memcpy H2D GB/s | memcpy D2H GB/s | "
      "one layer H2D ms | scatter pieces | scatter kernel H2D GB/s | "
      "scatter cudaMemcpyBatchAsync H2D GB/s |\n"
      "|---|--:|--:|--:|--:|--:|--:|--:|\n";
  for (const Baseline& b : r.baselines) {
    absl::StrAppend(&out, "| ", b.model, " | ", b.bytes, " | ", Num(b.h2d_gbps),
                    " | ", Num(b.d2h_gbps), " | ", Num(b.layer_h2d_ms), " | ",
                    b.pieces, " | ", Num(b.scatter_kernel_h2d_gbps), " | ",
                    b.scatter_batch_h2d_gbps > 0 ? Num(b.scatter_batch_h2d_gbps)
                                                 : "-",
                    " |\n");
  }
  const double get_pool = r.call.get_pool_us.Median();
  out +=
      "\n## Transfers through hostkvd\n\n| model | layout | mechanism | load "
      "GB/s | x memcpy | first layer ms | x one-layer memcpy | backup GB/s | "
      "x memcpy | Load call p50 us | x GetPool | reps |\n"
      "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n";
  for (const CaseResult& c : r.cases) {
    const Baseline& b = r.BaselineFor(c.model);
    if (c.load_reps == 0 || c.backup_reps == 0) {
      absl::StrAppend(&out, "| ", c.model, " | ", c.layout, " | ", c.mechanism,
                      " | failed: ",
                      absl::StrReplaceAll(c.error, {{"|", "/"}, {"\n", " "}}),
                      " | | | | | | | | |\n");
      continue;
    }
    absl::StrAppend(&out, "| ", c.model, " | ", c.layout, " | ", c.mechanism,
                    " | ", Num(c.load_gbps), " | ",
                    Num(c.load_gbps / b.h2d_gbps), " | ", Num(c.first_layer_ms),
                    " | ", Num(c.first_layer_ms / b.layer_h2d_ms), " | ",
                    Num(c.backup_gbps), " | ", Num(c.backup_gbps / b.d2h_gbps),
                    " | ", Num(c.load_call_us), " | ",
                    get_pool > 0 ? Num(c.load_call_us / get_pool) : "-", " | ",
                    c.load_reps, "/", c.backup_reps, " |\n");
  }
  out +=
      "\n## Per-layer loads\n\nWhen each layer was usable on the engine's "
      "stream, ms from the event before the Load call (medians):\n\n"
      "| model | layout | mechanism | layers | layer 0 | 1/4 | 1/2 | 3/4 | "
      "last | ms per later layer |\n|---|---|---|--:|--:|--:|--:|--:|--:|--:|\n";
  for (const CaseResult& c : r.cases) {
    const size_t n = c.layer_ms.size();
    if (n == 0) continue;
    const auto at = [&](size_t i) { return Num(c.layer_ms[std::min(i, n - 1)]); };
    absl::StrAppend(&out, "| ", c.model, " | ", c.layout, " | ", c.mechanism,
                    " | ", n, " | ", at(0), " | ", at(n / 4), " | ", at(n / 2),
                    " | ", at(3 * n / 4), " | ", at(n - 1), " | ",
                    n > 1 ? Num((c.layer_ms[n - 1] - c.layer_ms[0]) / (n - 1))
                          : "-",
                    " |\n");
  }
  const CallCost& k = r.call;
  absl::StrAppend(
      &out,
      "\n## Cost of the call\n\n| call | p50 us | p90 us | x GetPool p50 "
      "|\n|---|--:|--:|--:|\n| Load, one layer, ",
      k.runs, " device runs (enqueue only) | ", Num(k.load_us.Median()), " | ",
      Num(k.load_us.Percentile(90)), " | ",
      get_pool > 0 ? Num(k.load_us.Median() / get_pool) : "-",
      " |\n| GetPool (bare RPC, same daemon) | ", Num(get_pool), " | ",
      Num(k.get_pool_us.Percentile(90)), " | 1 |\n");
  if (!r.small_loads.empty()) {
    absl::StrAppend(
        &out,
        "\n## Small loads: call to first layer usable on the GPU\n\n"
        "| pages | first layer p50 us | p99 us | x GetPool p50 | Load call "
        "p50 us | samples |\n|--:|--:|--:|--:|--:|--:|\n");
    for (const SmallLoad& s : r.small_loads) {
      absl::StrAppend(
          &out, "| ", s.pages, " | ", Num(s.first_layer_us.Median()), " | ",
          Num(s.first_layer_us.Percentile(99)), " | ",
          get_pool > 0 ? Num(s.first_layer_us.Median() / get_pool) : "-",
          " | ", Num(s.call_us.Median()), " | ", s.first_layer_us.size(),
          " |\n");
    }
  }
  if (!r.notes.empty()) {
    out += "\nNotes:\n\n";
    for (const std::string& n : r.notes) absl::StrAppend(&out, "- ", n, "\n");
  }
  return out;
}

}  // namespace hostkv::gpu_bench
