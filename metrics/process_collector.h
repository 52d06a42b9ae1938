// ProcessCollector: the standard process_* metrics of this process, read from /proc at scrape
// time: cpu seconds, resident and virtual memory, open and max file descriptors, start time.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

namespace baton::metrics {

class ProcessCollector final : public prometheus::Collectable {
 public:
  ProcessCollector();
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  double start_time_seconds_;
};

}  // namespace baton::metrics
