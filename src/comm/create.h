// Communicator::Create for the runtime, which shares its fault injector
// with the training communicators it builds.
#ifndef HOLDFAST_SRC_COMM_CREATE_H_
#define HOLDFAST_SRC_COMM_CREATE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "holdfast/communicator.h"
#include "holdfast/store.h"
#include "src/fault/hooks.h"

namespace holdfast::comm {

// Communicator::Create, whose collectives count toward the `fail-op`
// faults of `faults` (null: none).
absl::StatusOr<std::unique_ptr<Communicator>> Create(
    std::shared_ptr<Store> store, const CommunicatorOptions& options,
    std::shared_ptr<fault::Hooks> faults);

}  // namespace holdfast::comm

#endif  // HOLDFAST_SRC_COMM_CREATE_H_
