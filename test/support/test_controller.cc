#include "test/support/test_controller.h"

#include <utility>

#include "src/control/controller/server.h"

namespace holdfast::testing {

absl::StatusOr<std::unique_ptr<TestController>> TestController::Start(
    const std::string& token, int world_size) {
  control::ControllerOptions o;
  o.token = token;
  o.world_size = world_size;
  auto server = control::ControllerServer::Start(o);
  if (!server.ok()) return server.status();
  return std::unique_ptr<TestController>(
      new TestController(std::move(*server)));
}

TestController::TestController(
    std::unique_ptr<control::ControllerServer> server)
    : server_(std::move(server)) {}

TestController::~TestController() { server_->Shutdown(); }

std::string TestController::address() const { return server_->address(); }

}  // namespace holdfast::testing
