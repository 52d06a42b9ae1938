// bench/cpu_wake: how long a thread blocked on a condition variable takes to run once it is
// signalled, after 2 ms with nothing to do, by where it runs. This is the machine's share of an
// idle job's latency: the path from an enqueue to its handler is five such wake-ups (the
// producer's backend signals the claim session's backend, which wakes the poller, which wakes
// that backend with the claim, whose answer wakes the poller, which wakes a pool thread).
//   bench/cpu_wake [--rounds 2000]
// Three placements, each thread pinned to one CPU (needs 2 CPUs):
//   same CPU        the signaller blocks right after signalling, leaving its CPU to the thread
//   other CPU idle  the thread's CPU has nothing to run (on a VM, a halted vCPU)
//   other CPU busy  the thread's CPU runs a nice-19 loop the thread must preempt
// Prints the median and 90th percentile in microseconds, and one JSON object per placement.
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

// Signals a thread pinned to `thread_cpu` from this thread pinned to CPU 0, `rounds` times, and
// returns the wake-ups' durations in microseconds, sorted.
std::vector<double> measure(int thread_cpu, bool busy, int rounds) {
  std::mutex m;
  std::condition_variable to_thread, to_main;
  bool go = false, done = false, acked = false;
  Clock::time_point sent, woke;
  std::thread waiter([&] {
    pin(thread_cpu);
    std::unique_lock lock(m);
    for (;;) {
      to_thread.wait(lock, [&] { return go || done; });
      if (done) return;
      woke = Clock::now();
      go = false;
      acked = true;
      to_main.notify_one();
    }
  });
  std::atomic<bool> stop{false};
  std::thread burner;
  if (busy) {
    burner = std::thread([&] {
      pin(thread_cpu);
      if (nice(19) == -1) std::perror("nice");
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  }
  pin(0);
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(rounds));
  for (int i = 0; i < rounds; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::unique_lock lock(m);
    go = true;
    acked = false;
    sent = Clock::now();
    lock.unlock();
    to_thread.notify_one();
    lock.lock();
    // Blocks: on the same CPU, the woken thread runs now.
    to_main.wait(lock, [&] { return acked; });
    us.push_back(std::chrono::duration<double, std::micro>(woke - sent).count());
  }
  {
    std::lock_guard lock(m);
    done = true;
  }
  to_thread.notify_one();
  waiter.join();
  stop = true;
  if (burner.joinable()) burner.join();
  std::sort(us.begin(), us.end());
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--rounds" && i + 1 < argc) {
      char* end = nullptr;
      const long value = std::strtol(argv[++i], &end, 10);
      rounds = *end == '\0' && value >= 10 && value <= 1'000'000 ? static_cast<int>(value) : 0;
      if (rounds == 0) {
        std::fprintf(stderr, "bench/cpu_wake: --rounds takes a whole number from 10 to 1000000\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: bench/cpu_wake [--rounds 2000]\n");
      return arg == "--help" || arg == "-h" ? 0 : 2;
    }
  }
  if (std::thread::hardware_concurrency() < 2 || !pin(1) || !pin(0)) {
    std::fprintf(stderr, "bench/cpu_wake: needs CPUs 0 and 1 to pin threads to\n");
    return 1;
  }
  struct Placement {
    const char* name;
    int cpu;
    bool busy;
  };
  for (const Placement p : {Placement{"same CPU", 0, false}, Placement{"other CPU idle", 1, false},
                            Placement{"other CPU busy", 1, true}}) {
    const auto us = measure(p.cpu, p.busy, rounds);
    const double p50 = us[us.size() / 2], p90 = us[us.size() * 9 / 10];
    std::printf("%-16s p50 %7.1f us  p90 %7.1f us  (%d wake-ups)\n", p.name, p50, p90, rounds);
    std::printf("{\"bench\":\"cpu_wake\",\"placement\":\"%s\",\"p50_us\":%.1f,\"p90_us\":%.1f}\n",
                p.name, p50, p90);
  }
  return 0;
}
