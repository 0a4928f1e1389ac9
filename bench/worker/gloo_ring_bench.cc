// The Gloo collectives, old against new, in one run: gloo's function-style
// algorithms (what GlooCommunicator called before: allreduce, reduce,
// broadcast, allgatherv, and reduce-scatter as an all-reduce of the whole
// buffer) against GlooCommunicator's ring collectives on point-to-point
// transfers (worker/comm/internal/gloo_ring.h), on the same machine, group
// size and buffers, alternating. Ranks are threads of this process over TCP
// on 127.0.0.1; medians of the timed repetitions; the bytes each variant put
// on the wire from the sockets' own counters (TCP_INFO). Not a test.
//
// Usage: muonshard-bench-gloo-ring [--ranks 4] [--floats 1048576] [--reps 9]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/rendezvous_store.h"
#include "common/tcp_stats.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/reduce.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/tcp/device.h"
#include "worker/comm/gloo_communicator.h"

namespace muonshard::worker {
namespace {

void SumFloats(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<float*>(c);
  const auto* x = static_cast<const float*>(a);
  const auto* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

// Runs fn(rank) on one thread per rank; returns the wall seconds.
double OnRanks(int n, const std::function<void(int)>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Measured {
  double seconds = 0;  // median
  int64_t wire = 0;    // bytes of one repetition, all ranks
};

Measured Time(int n, int reps, const std::function<void(int)>& fn) {
  std::vector<double> times;
  int64_t wire = 0;
  OnRanks(n, fn);  // warm-up
  for (int i = 0; i < reps; ++i) {
    const int64_t before = ProcessTcpBytesReceived().value_or(0);
    times.push_back(OnRanks(n, fn));
    wire = ProcessTcpBytesReceived().value_or(0) - before;
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], wire};
}

int Main(int argc, char** argv) {
  int n = 4;
  int64_t floats = 1 << 20;
  int reps = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    bool ok = true;
    if (flag == "--ranks")
      ok = absl::SimpleAtoi(argv[i + 1], &n);
    else if (flag == "--floats")
      ok = absl::SimpleAtoi(argv[i + 1], &floats);
    else if (flag == "--reps")
      ok = absl::SimpleAtoi(argv[i + 1], &reps);
    else
      ok = false;
    if (!ok || n < 2 || floats < n || reps < 1) {
      std::fprintf(stderr, "usage: %s [--ranks N>=2] [--floats F>=N] [--reps R>=1]\n", argv[0]);
      return 2;
    }
  }
  // gloo's algorithms on contexts of their own.
  gloo::rendezvous::HashStore store;
  std::vector<std::shared_ptr<gloo::rendezvous::Context>> ctx(n);
  OnRanks(n, [&](int r) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto c = std::make_shared<gloo::rendezvous::Context>(r, n);
    c->setTimeout(std::chrono::seconds(120));
    auto device = gloo::transport::tcp::CreateDevice(attr);
    c->connectFullMesh(store, device);
    ctx[r] = c;
  });
  // The communicators' rings.
  InMemoryRendezvousStore kv;
  std::vector<std::unique_ptr<Communicator>> comm(n);
  OnRanks(n, [&](int r) {
    GlooOptions o;
    o.rank = r;
    o.size = n;
    o.key_prefix = "bench/";
    o.timeout = absl::Seconds(120);
    comm[r] = *CreateGlooCommunicator(o, &kv);
  });
  std::vector<int64_t> counts(n, floats / n);
  counts[0] += floats % n;
  std::vector<size_t> byte_counts;
  for (int64_t c : counts) byte_counts.push_back(c * sizeof(float));
  std::vector<std::vector<float>> buf(n, std::vector<float>(floats, 1.0f));
  std::vector<std::vector<float>> out(n, std::vector<float>(floats));
  uint32_t tag = 0;
  struct Row {
    const char* op;
    Measured old_way, ring;
  };
  std::vector<Row> rows;
  auto gloo_allreduce = [&](int r) {
    gloo::AllreduceOptions o(ctx[r]);
    o.setOutput(buf[r].data(), floats);
    o.setReduceFunction(&SumFloats);
    o.setTag(tag);
    gloo::allreduce(o);
  };
  rows.push_back({"reduce-scatter",
                  Time(n, reps,
                       [&](int r) {
                         std::vector<float> wide(buf[r]);  // the old path's fp32 copy
                         gloo::AllreduceOptions o(ctx[r]);
                         o.setOutput(wide.data(), floats);
                         o.setReduceFunction(&SumFloats);
                         o.setTag(tag);
                         gloo::allreduce(o);
                       }),
                  Time(n, reps, [&](int r) {
                    (void)comm[r]->ReduceScatter(buf[r].data(), out[r].data(), counts, CommDType::kFloat32,
                                                 ReduceOp::kSum);
                  })});
  rows.push_back({"all-gather",
                  Time(n, reps,
                       [&](int r) {
                         gloo::AllgathervOptions o(ctx[r]);
                         o.setInput(reinterpret_cast<uint8_t*>(buf[r].data()), byte_counts[r]);
                         o.setOutput(reinterpret_cast<uint8_t*>(out[r].data()), byte_counts);
                         o.setTag(tag);
                         gloo::allgatherv(o);
                       }),
                  Time(n, reps, [&](int r) {
                    (void)comm[r]->AllGather(buf[r].data(), out[r].data(), counts, CommDType::kFloat32);
                  })});
  rows.push_back({"reduce",
                  Time(n, reps,
                       [&](int r) {
                         gloo::ReduceOptions o(ctx[r]);
                         o.setOutput(buf[r].data(), floats);
                         o.setRoot(0);
                         o.setReduceFunction(&SumFloats);
                         o.setTag(tag);
                         gloo::reduce(o);
                       }),
                  Time(n, reps, [&](int r) {
                    (void)comm[r]->Reduce(buf[r].data(), floats, CommDType::kFloat32, ReduceOp::kSum, 0);
                  })});
  rows.push_back(
      {"broadcast",
       Time(n, reps,
            [&](int r) {
              gloo::BroadcastOptions o(ctx[r]);
              o.setOutput(reinterpret_cast<uint8_t*>(buf[r].data()), floats * sizeof(float));
              o.setRoot(0);
              o.setTag(tag);
              gloo::broadcast(o);
            }),
       Time(n, reps, [&](int r) { (void)comm[r]->Broadcast(buf[r].data(), floats, CommDType::kFloat32, 0); })});
  rows.push_back({"all-reduce", Time(n, reps, gloo_allreduce), Time(n, reps, [&](int r) {
                    (void)comm[r]->AllReduce(buf[r].data(), floats, CommDType::kFloat32, ReduceOp::kSum);
                  })});
  const double mb = floats * sizeof(float) / 1e6;
  std::printf("%d ranks (threads, TCP on 127.0.0.1), %.1f MB fp32 buffer, median of %d\n\n", n, mb, reps);
  std::printf("| op | gloo algorithm ms | ring ms | ring/gloo | gloo wire MB/rank | ring wire MB/rank |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Row& row : rows) {
    std::printf("| %s | %.2f | %.2f | %.3f | %.3f | %.3f |\n", row.op, row.old_way.seconds * 1e3,
                row.ring.seconds * 1e3, row.ring.seconds / row.old_way.seconds, row.old_way.wire / 1e6 / n,
                row.ring.wire / 1e6 / n);
  }
  return 0;
}

}  // namespace
}  // namespace muonshard::worker

int main(int argc, char** argv) { return muonshard::worker::Main(argc, argv); }
