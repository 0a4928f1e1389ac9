#ifndef MUONSHARD_FUZZ_FUZZ_UTIL_H_
#define MUONSHARD_FUZZ_FUZZ_UTIL_H_

// Helpers shared by the fuzz targets (fuzz/*_fuzzer.cc). Each target defines
// LLVMFuzzerTestOneInput; it is linked either with libFuzzer (MUONSHARD_FUZZ,
// clang) or with replay_main.cc, which runs the seed corpus once (the default
// build, ctest). See docs/hardening.md.
//
// A target never aborts on bad input: the code under test must turn any
// input into an absl::Status. FUZZ_CHECK marks the invariants a target checks
// on top of "no crash, no leak, no sanitizer report": a violation is a bug of
// the code under test, reported with the input that shows it.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"

#define FUZZ_CHECK(cond, ...)                                                               \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s: %s\n", __FILE__, __LINE__, #cond, \
                   std::string(__VA_ARGS__).c_str());                                       \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

namespace muonshard::fuzz {

// Protobuf logs (e.g. "String field contains invalid UTF-8") go nowhere, so
// a long run's output stays readable. FATAL still aborts.
void SilenceProtobufLogs();

// Reads a fuzz input front to back. Every read succeeds: past the end it
// yields zeros and empty strings, so any input is a valid script.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(reinterpret_cast<const char*>(data)), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  size_t remaining() const { return size_ - pos_; }

  uint8_t Byte() { return pos_ < size_ ? static_cast<uint8_t>(data_[pos_++]) : 0; }
  uint16_t U16() {
    uint16_t lo = Byte();
    return static_cast<uint16_t>(lo | (uint16_t{Byte()} << 8));
  }
  // A length-prefixed (2 bytes, little-endian) chunk, cut at the end.
  absl::string_view Chunk() { return Take(U16()); }
  // The next `n` bytes (fewer at the end).
  absl::string_view Take(size_t n) {
    if (n > remaining()) n = remaining();
    absl::string_view out(data_ + pos_, n);
    pos_ += n;
    return out;
  }
  absl::string_view Rest() { return Take(remaining()); }

 private:
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace muonshard::fuzz

#endif  // MUONSHARD_FUZZ_FUZZ_UTIL_H_
