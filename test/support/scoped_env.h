// An environment variable set for one scope (a test case), and unset at
// its end. Header-only.
#ifndef HOLDFAST_TEST_SUPPORT_SCOPED_ENV_H_
#define HOLDFAST_TEST_SUPPORT_SCOPED_ENV_H_

#include <cstdlib>

namespace holdfast::test {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    setenv(name, value, 1);
  }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

}  // namespace holdfast::test

#endif  // HOLDFAST_TEST_SUPPORT_SCOPED_ENV_H_
