#ifndef MUONSHARD_COMMON_CLOCK_H_
#define MUONSHARD_COMMON_CLOCK_H_

#include "absl/time/time.h"

namespace muonshard {

// Injected wherever timeouts or heartbeats exist, so tests can use a fake.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The process-wide real clock; never destroyed.
Clock* RealClock();

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_CLOCK_H_
