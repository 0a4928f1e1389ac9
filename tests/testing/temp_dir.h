#ifndef MUONSHARD_TESTS_TESTING_TEMP_DIR_H_
#define MUONSHARD_TESTS_TESTING_TEMP_DIR_H_

// A fresh directory under $TMPDIR (or /tmp), removed with its contents when
// the object goes away.

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace muonshard::testing {

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/muonshard-test-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Empty when the directory could not be created.
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// One directory for the whole test process, made on first use and removed
// at exit, for helpers shared by many cases: ctest runs cases, and CI may
// run whole suites, side by side, so fixed names under /tmp would collide.
inline const std::string& ProcessTempDir() {
  static const TempDir dir;  // a test binary may destroy statics at exit
  return dir.path();
}

}  // namespace muonshard::testing

#endif  // MUONSHARD_TESTS_TESTING_TEMP_DIR_H_
