// Reading a spec file into the request that submits it: the spec with Megatron's defaults
// resolved and, for backend replay, the replay table the spec names (read here, by the client,
// so a worker never opens a path a client named).
// Thread-safety: pure function of its argument (and the files it reads).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "remat/v1/remat.pb.h"

namespace remat::cli {

// InvalidArgument naming the field ("model.hidden_size: ...") or the file for bad input.
absl::StatusOr<remat::v1::SubmitSearchRequest> BuildSubmitRequest(const std::string& spec_path);

}  // namespace remat::cli
