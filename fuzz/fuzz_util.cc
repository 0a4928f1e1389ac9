#include "fuzz/fuzz_util.h"

#include "google/protobuf/stubs/logging.h"

namespace muonshard::fuzz {

void SilenceProtobufLogs() {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
}

}  // namespace muonshard::fuzz
