// hostkv_gpu_bench's report without a GPU: the Markdown and JSON carry
// every section the first GPU run must bring back, and ReportOutput keeps
// what was measured when the run is cut short.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_bench_output.h"
#include "tests/gpu/gpu_bench_report.h"

namespace hostkv::gpu_bench {
namespace {

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

Report OneCase() {
  Report r;
  r.meta = {{"gpu", "test"}};
  r.baselines.push_back({"MHA", 1 << 20, 1 << 18, 40, 40, 0.01, 1024, 30, 0});
  CaseResult c;
  c.model = "MHA";
  c.layout = "PAGE_FIRST";
  c.mechanism = "KERNEL";
  c.load_reps = c.backup_reps = 3;
  c.load_gbps = 20;
  c.backup_gbps = 10;
  c.first_layer_ms = 0.1;
  c.layer_ms = {0.1, 0.2, 0.3, 0.4, 0.5};
  r.cases.push_back(c);
  SmallLoad s;
  s.pages = 4;
  for (double v : {30.0, 40.0, 50.0}) s.first_layer_us.Add(v);
  s.call_us.Add(20);
  r.small_loads.push_back(s);
  return r;
}

TEST(GpuBenchReport, HasThePerLayerAndSmallLoadSections) {
  const Report r = OneCase();
  const std::string md = Markdown(r);
  EXPECT_NE(std::string::npos, md.find("## Per-layer loads"));
  // The scatter baselines, "-" where the driver has no batch copies.
  EXPECT_NE(std::string::npos, md.find("| 0.010 | 1024 | 30.0 | - |")) << md;
  // layers 5: layer 0, 1/4 (index 1), 1/2 (2), 3/4 (3), last; 0.1 ms per later layer
  EXPECT_NE(std::string::npos,
            md.find("| MHA | PAGE_FIRST | KERNEL | 5 | 0.100 | 0.200 | 0.300 | 0.400 | "
                    "0.500 | 0.100 |"))
      << md;
  EXPECT_NE(std::string::npos, md.find("## Small loads"));
  EXPECT_NE(std::string::npos, md.find("| 4 | 40.0 | 50.0 |")) << md;
  const std::string json = Json(r);
  EXPECT_NE(std::string::npos, json.find("\"small_loads\": [{\"pages\": 4"))
      << json;
  EXPECT_NE(std::string::npos, json.find("\"notes\": []")) << json;
  // JSON only: no Markdown section leaked into it.
  EXPECT_EQ(std::string::npos, json.find("## ")) << json;
  EXPECT_EQ('{', json.front());
}

TEST(GpuBenchReport, OutputKeepsTheLastReportWhenInterrupted) {
  const std::string dir =
      (std::filesystem::temp_directory_path() /
       ("gpu-bench-report-" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  ReportOutput output(dir);
  Report r = OneCase();
  ASSERT_TRUE(output.Write(r));
  EXPECT_EQ(Markdown(r), Read(dir + "/gpu_bench.md"));
  r.cases.clear();  // later changes are not written until the next Write
  output.Interrupted("interrupted by SIGTERM");
  const std::string md = Read(dir + "/gpu_bench.md");
  EXPECT_NE(std::string::npos, md.find("| MHA | PAGE_FIRST | KERNEL |"));
  EXPECT_NE(std::string::npos, md.find("- interrupted by SIGTERM"));
  EXPECT_NE(std::string::npos,
            Read(dir + "/gpu_bench.json").find("\"interrupted by SIGTERM\""));
  EXPECT_FALSE(std::filesystem::exists(dir + "/gpu_bench.md.tmp"));
  // The JSON is JSON (python3's parser; every machine that runs CI has it).
  const std::string parse =
      "python3 -c 'import json, sys; json.load(open(sys.argv[1]))' " + dir +
      "/gpu_bench.json";
  EXPECT_EQ(0, std::system(parse.c_str())) << Read(dir + "/gpu_bench.json");
  EXPECT_FALSE(ReportOutput("/nonexistent-dir/x").Write(r));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hostkv::gpu_bench
