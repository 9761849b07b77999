// Section 1c: where a large Load request's time goes, in-process. The
// TransferRequest of section 1's 1,000-page load (1,000 host page runs and
// 1,000 device slot runs) is built and serialized as client/client.cc does,
// and parsed as the daemon's generated service does, beside the same for one
// run; then the same on a protobuf Arena, and as packed varint pairs (what a
// packed `repeated uint64` encoding of the runs would cost).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
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

// As Client::Transfer fills it.
void Fill(const Runs& runs, v1::TransferRequest* request) {
  request->set_session_id(std::string(16, '\x5a'));
  request->set_pool("ctl");
  request->set_import_id(1);
  request->mutable_host_pages()->Reserve(static_cast<int>(runs.host.size()));
  for (const Run& p : runs.host) {
    v1::PageRun* run = request->add_host_pages();
    run->set_first_page(p.first);
    run->set_num_pages(p.count);
  }
  request->mutable_device_slots()->Reserve(static_cast<int>(runs.device.size()));
  for (const Run& s : runs.device) {
    v1::SlotRun* run = request->add_device_slots();
    run->set_first_slot(s.first);
    run->set_num_slots(s.count);
  }
}

double BuildSerialize(const Runs& runs, bool arena, std::string* out) {
  const Clock::time_point t0 = Clock::now();
  if (arena) {
    google::protobuf::Arena a;
    auto* request = google::protobuf::Arena::CreateMessage<v1::TransferRequest>(&a);
    Fill(runs, request);
    request->SerializeToString(out);
  } else {
    v1::TransferRequest request;
    Fill(runs, &request);
    request.SerializeToString(out);
  }
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

// The runs as packed varint pairs (first, count), one list per side.
double PackedEncode(const Runs& runs, std::string* out) {
  const Clock::time_point t0 = Clock::now();
  out->clear();
  {
    google::protobuf::io::StringOutputStream stream(out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    for (const std::vector<Run>* side : {&runs.host, &runs.device}) {
      coded.WriteVarint64(side->size());
      for (const Run& r : *side) {
        coded.WriteVarint64(r.first);
        coded.WriteVarint64(r.count);
      }
    }
  }
  return NanosBetween(t0, Clock::now());
}

double PackedDecode(const std::string& wire) {
  const Clock::time_point t0 = Clock::now();
  google::protobuf::io::CodedInputStream coded(
      reinterpret_cast<const uint8_t*>(wire.data()), static_cast<int>(wire.size()));
  Runs runs;
  for (std::vector<Run>* side : {&runs.host, &runs.device}) {
    uint64_t n = 0;
    if (!coded.ReadVarint64(&n)) Die("decode");
    side->resize(n);
    for (Run& r : *side) {
      if (!coded.ReadVarint64(&r.first) || !coded.ReadVarint64(&r.count)) {
        Die("decode");
      }
    }
  }
  return NanosBetween(t0, Clock::now());
}

}  // namespace

void RunRequestCost(const Options& options, Report& report) {
  std::fprintf(stderr, "request encoding cost in-process\n");
  const int reps = options.quick ? 300 : 3000;
  const Runs one = MakeRuns(1), many = MakeRuns(1000);
  Samples build1, parse1, build, parse, build_arena, parse_arena, enc, dec;
  std::string wire1, wire, packed;
  for (int i = 0; i < reps; ++i) {
    build1.Add(BuildSerialize(one, false, &wire1));
    parse1.Add(Parse(wire1, false));
    build.Add(BuildSerialize(many, false, &wire));
    parse.Add(Parse(wire, false));
    build_arena.Add(BuildSerialize(many, true, &wire));
    parse_arena.Add(Parse(wire, true));
    enc.Add(PackedEncode(many, &packed));
    dec.Add(PackedDecode(packed));
  }
  struct Out {
    const char* name;
    const char* config;
    const Samples* value;
    const Samples* base;
    const char* baseline;
  };
  const Out outs[] = {
      {"TransferRequest build + serialize (client side)",
       "1,000 + 1,000 runs", &build, &build1, "same, 1 + 1 run"},
      {"TransferRequest parse + free (daemon side)", "1,000 + 1,000 runs",
       &parse, &parse1, "same, 1 + 1 run"},
      {"TransferRequest build + serialize on an Arena", "1,000 + 1,000 runs",
       &build_arena, &build, "same, heap (as client.cc does)"},
      {"TransferRequest parse on an Arena", "1,000 + 1,000 runs", &parse_arena,
       &parse, "same, heap (as the sync service does)"},
      {"Runs as packed varint pairs: encode", "1,000 + 1,000 runs", &enc,
       &build, "TransferRequest build + serialize, heap"},
      {"Runs as packed varint pairs: decode", "1,000 + 1,000 runs", &dec,
       &parse, "TransferRequest parse, heap"},
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
    row.note = absl::StrCat(wire.size(), " bytes on the wire as protobuf, ",
                            packed.size(), " packed");
    report.Add(row);
  }
}

}  // namespace hostkv::bench
