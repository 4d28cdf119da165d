#include "server/status_util.h"

namespace remat::server {

absl::Status ToAbsl(const search::Status& status) {
  switch (status.code()) {
    case search::StatusCode::kOk:
      return absl::OkStatus();
    case search::StatusCode::kInvalidArgument:
      return absl::InvalidArgumentError(status.message());
    case search::StatusCode::kFailedPrecondition:
      return absl::FailedPreconditionError(status.message());
    case search::StatusCode::kNotFound:
      return absl::NotFoundError(status.message());
    case search::StatusCode::kInternal:
      return absl::InternalError(status.message());
  }
  return absl::InternalError(status.message());
}

}  // namespace remat::server
