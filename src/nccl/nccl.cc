// The public holdfast::nccl API (include/holdfast/nccl.h) that works on
// communicators: above both the comm layer and the NCCL backend.
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "holdfast/nccl.h"
#include "holdfast/status.h"
#include "src/backend/nccl/nccl_backend.h"
#include "src/comm/communicator_impl.h"

namespace holdfast::nccl {
namespace {

backend::Backend* BackendOf(Communicator& comm) {
  auto* impl = dynamic_cast<comm::CommunicatorImpl*>(&comm);
  return impl == nullptr ? nullptr : impl->backend();
}

}  // namespace

int DeviceCount() { return backend::NcclDeviceCount(); }

void Register() { backend::RegisterNccl(); }

int LoadedVersion() { return backend::NcclLoadedVersion(); }

int BuiltVersion() { return backend::NcclBuiltVersion(); }

void* Stream(Communicator& comm) {
  backend::Backend* b = BackendOf(comm);
  return b == nullptr ? nullptr : backend::NcclStream(b);
}

absl::StatusOr<std::unique_ptr<Communicator>> Shrink(
    Communicator& old, const std::vector<int>& exclude,
    std::shared_ptr<Store> store, const CommunicatorOptions& options) {
  backend::Backend* b = BackendOf(old);
  if (b == nullptr || !backend::IsNccl(b)) {
    return absl::InvalidArgumentError(
        "nccl::Shrink: the communicator is not an NCCL one");
  }
  std::vector<bool> gone(static_cast<size_t>(old.size()), false);
  for (int r : exclude) {
    if (r < 0 || r >= old.size() || gone[static_cast<size_t>(r)]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "nccl::Shrink: excluded rank ", r, " is out of range [0, ",
          old.size(), ") or listed twice"));
    }
    gone[static_cast<size_t>(r)] = true;
  }
  if (gone[static_cast<size_t>(old.rank())]) {
    return absl::InvalidArgumentError(
        "nccl::Shrink: this rank is in the excluded list");
  }
  const int survivors = old.size() - static_cast<int>(exclude.size());
  int new_rank = 0;
  for (int r = 0; r < old.rank(); ++r) new_rank += gone[r] ? 0 : 1;

  CommunicatorOptions o = options;
  o.backend = "nccl";
  o.rank = new_rank;
  o.size = survivors;
  HOLDFAST_ASSIGN_OR_RETURN(
      std::unique_ptr<backend::Backend> fresh,
      backend::ShrinkNccl(b, exclude, *store, comm::ToBackendOptions(o)));
  old.Abort("replaced by a shrunk communicator");
  return std::unique_ptr<Communicator>(
      new comm::CommunicatorImpl(o, std::move(store), std::move(fresh)));
}

}  // namespace holdfast::nccl
