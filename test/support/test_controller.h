// A holdfast controller in this process, behind a header that includes
// none of its gRPC and protobuf headers: for tests compiled against
// libtorch, whose include directory ships protobuf and fmt headers of its
// own that would shadow the system's.
#ifndef HOLDFAST_TEST_SUPPORT_TEST_CONTROLLER_H_
#define HOLDFAST_TEST_SUPPORT_TEST_CONTROLLER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace holdfast::control {
class ControllerServer;
}  // namespace holdfast::control

namespace holdfast::testing {

class TestController {
 public:
  // A controller on a free loopback port for a job of `world_size` slots
  // that authenticates with `token`.
  static absl::StatusOr<std::unique_ptr<TestController>> Start(
      const std::string& token, int world_size);
  ~TestController();  // shuts it down

  TestController(const TestController&) = delete;
  TestController& operator=(const TestController&) = delete;

  std::string address() const;

 private:
  explicit TestController(std::unique_ptr<control::ControllerServer> server);
  std::unique_ptr<control::ControllerServer> server_;
};

}  // namespace holdfast::testing

#endif  // HOLDFAST_TEST_SUPPORT_TEST_CONTROLLER_H_
