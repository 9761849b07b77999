// Section 1c: where a large Load request's time goes, in-process. The
// TransferRequest of section 1's 1,000-page load (1,000 host page runs and
// 1,000 device slot runs) is built and serialized as client/client.cc does
// (flat packed pairs: host_page_pairs, device_slot_pairs), and parsed as
// gRPC's synchronous service does (on the heap) and as the command ring
// does (on an Arena), beside the same for one run; then the encoding the
// clients used before, one PageRun/SlotRun message per run.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "hostkv/v1/hostkv.pb.h"
#include "tests/bench/sections.h"

namespace hostkv::bench {
namespace {

struct Run {
  uint64_t first, count;
};

struct Runs {
  std::vector<Run> host, device;
};

Runs MakeRuns(uint64_t n) {
  Runs r;
  for (uint64_t i = 0; i < n; ++i) {
    r.host.push_back({2 * i, 1});
    r.device.push_back({32 * i, 16});
  }
  return r;
}

enum class Encoding { kPairs, kMessages };

// As Client::Transfer fills it (kPairs), or one message per run (kMessages).
void Fill(const Runs& runs, Encoding encoding, v1::TransferRequest* request) {
  request->set_session_id(std::string(16, '\x5a'));
  request->set_pool("ctl");
  request->set_import_id(1);
  if (encoding == Encoding::kPairs) {
    auto* host = request->mutable_host_page_pairs();
    host->Reserve(static_cast<int>(2 * runs.host.size()));
    for (const Run& p : runs.host) {
      host->Add(p.first);
      host->Add(p.count);
    }
    auto* device = request->mutable_device_slot_pairs();
    device->Reserve(static_cast<int>(2 * runs.device.size()));
    for (const Run& d : runs.device) {
      device->Add(d.first);
      device->Add(d.count);
    }
    return;
  }
  request->mutable_host_pages()->Reserve(static_cast<int>(runs.host.size()));
  for (const Run& p : runs.host) {
    v1::PageRun* run = request->add_host_pages();
    run->set_first_page(p.first);
    run->set_num_pages(p.count);
  }
  request->mutable_device_slots()->Reserve(static_cast<int>(runs.device.size()));
  for (const Run& d : runs.device) {
    v1::SlotRun* run = request->add_device_slots();
    run->set_first_slot(d.first);
    run->set_num_slots(d.count);
  }
}

double BuildSerialize(const Runs& runs, Encoding encoding, std::string* out) {
  const Clock::time_point t0 = Clock::now();
  v1::TransferRequest request;
  Fill(runs, encoding, &request);
  request.SerializeToString(out);
  return NanosBetween(t0, Clock::now());
}

double Parse(const std::string& wire, bool arena) {
  const Clock::time_point t0 = Clock::now();
  if (arena) {
    google::protobuf::Arena a;
    auto* request = google::protobuf::Arena::CreateMessage<v1::TransferRequest>(&a);
    if (!request->ParseFromString(wire)) Die("parse");
  } else {
    v1::TransferRequest request;
    if (!request.ParseFromString(wire)) Die("parse");
  }
  return NanosBetween(t0, Clock::now());
}

}  // namespace

void RunRequestCost(const Options& options, Report& report) {
  std::fprintf(stderr, "request encoding cost in-process\n");
  const int reps = options.quick ? 300 : 3000;
  const Runs one = MakeRuns(1), many = MakeRuns(1000);
  Samples build1, parse1, build, parse, parse_arena, build_msgs, parse_msgs;
  std::string wire1, wire, wire_msgs;
  for (int i = 0; i < reps; ++i) {
    build1.Add(BuildSerialize(one, Encoding::kPairs, &wire1));
    parse1.Add(Parse(wire1, false));
    build.Add(BuildSerialize(many, Encoding::kPairs, &wire));
    parse.Add(Parse(wire, false));
    parse_arena.Add(Parse(wire, true));
    build_msgs.Add(BuildSerialize(many, Encoding::kMessages, &wire_msgs));
    parse_msgs.Add(Parse(wire_msgs, false));
  }
  struct Out {
    const char* name;
    const char* config;
    const Samples* value;
    const Samples* base;
    const char* baseline;
  };
  const Out outs[] = {
      {"TransferRequest build + serialize (client side, pairs)",
       "1,000 + 1,000 runs", &build, &build1, "same, 1 + 1 run"},
      {"TransferRequest parse + free (gRPC's sync service, heap)",
       "1,000 + 1,000 runs", &parse, &parse1, "same, 1 + 1 run"},
      {"TransferRequest parse on an Arena (the command ring)",
       "1,000 + 1,000 runs", &parse_arena, &parse, "same, heap"},
      {"One PageRun/SlotRun message per run: build + serialize",
       "1,000 + 1,000 runs", &build_msgs, &build, "pairs (as client.cc)"},
      {"One PageRun/SlotRun message per run: parse", "1,000 + 1,000 runs",
       &parse_msgs, &parse, "pairs, heap"},
  };
  for (const Out& o : outs) {
    Row row;
    row.section = "request_cost";
    row.name = o.name;
    row.config = o.config;
    row.metric = "median time";
    row.unit = "us";
    row.value = o.value->Median() / 1e3;
    row.baseline = o.baseline;
    row.baseline_value = o.base->Median() / 1e3;
    row.note = absl::StrCat(wire.size(), " bytes on the wire as pairs, ",
                            wire_msgs.size(), " as messages");
    report.Add(row);
  }
}

}  // namespace hostkv::bench
