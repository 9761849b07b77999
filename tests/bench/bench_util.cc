#include "tests/bench/bench_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

namespace hostkv::bench {

double Samples::Percentile(double p) const {
  if (v_.empty()) return 0;
  std::vector<double> s = v_;
  std::sort(s.begin(), s.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * s.size()));
  rank = std::clamp<size_t>(rank, 1, s.size());
  return s[rank - 1];
}

double Samples::Mean() const {
  if (v_.empty()) return 0;
  return std::accumulate(v_.begin(), v_.end(), 0.0) / v_.size();
}

double Samples::Min() const {
  return v_.empty() ? 0 : *std::min_element(v_.begin(), v_.end());
}

double Samples::Max() const {
  return v_.empty() ? 0 : *std::max_element(v_.begin(), v_.end());
}

std::string Num(double v) {
  char buf[64];
  const double a = std::fabs(v);
  if (v == 0) return "0";
  if (a >= 1e6 || a < 1e-3) {
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  } else if (a >= 100) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else if (a >= 10) {
    std::snprintf(buf, sizeof(buf), "%.1f", v);
  } else if (a >= 1) {
    std::snprintf(buf, sizeof(buf), "%.2f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3f", v);
  }
  return buf;
}

void Touch(void* p, size_t n, unsigned char value) { std::memset(p, value, n); }

Row& Report::Add(Row row) {
  row.ratio = row.baseline_value != 0 ? row.value / row.baseline_value : 0;
  switch (row.target.kind) {
    case Target::kNone:
      row.verdict = "";
      break;
    case Target::kAtMost:
      row.verdict = row.ratio <= row.target.bound ? "met" : "MISSED";
      break;
    case Target::kAtLeast:
      row.verdict = row.ratio >= row.target.bound ? "met" : "MISSED";
      break;
  }
  std::fprintf(stderr, "  %-10s %-44s %-34s %-11s %10s %-8s | %-34s %10s | x%-6s %s %s\n",
               row.section.c_str(), row.name.c_str(), row.config.c_str(),
               row.metric.c_str(), Num(row.value).c_str(), row.unit.c_str(),
               row.baseline.c_str(), Num(row.baseline_value).c_str(),
               Num(row.ratio).c_str(), row.target.text.c_str(),
               row.verdict.c_str());
  rows_.push_back(std::move(row));
  return rows_.back();
}

namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

const char* SectionTitle(const std::string& section) {
  static const std::map<std::string, const char*> titles = {
      {"control", "1. Control path: round-trip latency through the real daemon"},
      {"throughput", "1b. Control path: throughput with concurrent clients"},
      {"request_cost",
       "1c. Where a 1,000-page Load request's time goes (in-process encoding)"},
      {"allocator", "2. Allocator (in-process SlotAllocator)"},
      {"daemon_alloc", "2b. Allocator through the daemon"},
      {"copy", "3. CPU data path (in-process CpuCopyEngine)"},
      {"daemon_copy", "3b. CPU data path through the daemon"},
      {"pool_start", "4. Pool start"},
      {"cache", "5. Page cache (in-process PageCache)"},
      {"tier", "6. Storage tiers (in-process RedisTier, FileTier)"},
  };
  auto it = titles.find(section);
  return it == titles.end() ? section.c_str() : it->second;
}

}  // namespace

std::string Report::Json() const {
  std::string out = "{\n  \"meta\": {";
  for (size_t i = 0; i < meta_.size(); ++i) {
    out += (i ? ",\n    " : "\n    ") + JsonString(meta_[i].first) + ": " +
           JsonString(meta_[i].second);
  }
  out += "\n  },\n  \"rows\": [";
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    out += i ? ",\n    {" : "\n    {";
    out += "\"section\": " + JsonString(r.section);
    out += ", \"name\": " + JsonString(r.name);
    out += ", \"config\": " + JsonString(r.config);
    out += ", \"metric\": " + JsonString(r.metric);
    out += ", \"unit\": " + JsonString(r.unit);
    out += ", \"value\": " + JsonNumber(r.value);
    out += ", \"baseline\": " + JsonString(r.baseline);
    out += ", \"baseline_value\": " + JsonNumber(r.baseline_value);
    out += ", \"ratio\": " + JsonNumber(r.ratio);
    out += ", \"target\": " + JsonString(r.target.text);
    out += ", \"target_bound\": " +
           (r.target.kind == Target::kNone ? std::string("null")
                                           : JsonNumber(r.target.bound));
    out += ", \"target_kind\": " +
           JsonString(r.target.kind == Target::kAtMost    ? "ratio<="
                      : r.target.kind == Target::kAtLeast ? "ratio>="
                                                          : "");
    out += ", \"verdict\": " + JsonString(r.verdict);
    out += ", \"note\": " + JsonString(r.note);
    out += "}";
  }
  out += "\n  ]\n}\n";
  return out;
}

std::string Report::Markdown() const {
  std::string out = "# hostkv benchmarks\n\n";
  for (const auto& [k, v] : meta_) out += "- " + k + ": " + v + "\n";
  out +=
      "\nEvery figure stands beside a baseline measured in the same run; "
      "ratio = hostkv / baseline.\n";

  int met = 0, missed = 0;
  std::string missed_list;
  for (const Row& r : rows_) {
    if (r.verdict == "met") ++met;
    if (r.verdict == "MISSED") {
      ++missed;
      missed_list += "- " + r.name + " [" + r.config + "] " + r.metric + ": x" +
                     Num(r.ratio) + " (target " + r.target.text + ")\n";
    }
  }
  out += "\nTargets: " + std::to_string(met) + " met, " +
         std::to_string(missed) + " missed.\n";
  if (!missed_list.empty()) out += "\nMissed:\n\n" + missed_list;

  // Rows grouped by section, sections in order of first appearance.
  std::vector<std::string> order;
  for (const Row& r : rows_) {
    if (std::find(order.begin(), order.end(), r.section) == order.end()) {
      order.push_back(r.section);
    }
  }
  std::vector<const Row*> sorted;
  for (const std::string& s : order) {
    for (const Row& r : rows_) {
      if (r.section == s) sorted.push_back(&r);
    }
  }
  std::string section;
  for (const Row* rp : sorted) {
    const Row& r = *rp;
    if (r.section != section) {
      section = r.section;
      out += std::string("\n## ") + SectionTitle(section) + "\n\n";
      out +=
          "| benchmark | config | metric | hostkv | baseline | baseline value "
          "| ratio | target | verdict |\n"
          "|---|---|---|--:|---|--:|--:|---|---|\n";
    }
    out += "| " + r.name + (r.note.empty() ? "" : " (" + r.note + ")") +
           " | " + r.config + " | " + r.metric + " | " + Num(r.value) + " " +
           r.unit + " | " + r.baseline + " | " + Num(r.baseline_value) + " " +
           r.unit + " | " + Num(r.ratio) + "x | " + r.target.text + " | " +
           (r.verdict == "MISSED" ? "**MISSED**" : r.verdict) + " |\n";
  }
  return out;
}

}  // namespace hostkv::bench
