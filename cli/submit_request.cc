#include "cli/submit_request.h"

#include "proto/convert.h"
#include "specfile/spec_file.h"

namespace remat::cli {

absl::StatusOr<remat::v1::SubmitSearchRequest> BuildSubmitRequest(const std::string& spec_path) {
  auto spec = spec::LoadSpecFile(spec_path);
  if (!spec.ok()) return absl::InvalidArgumentError(spec.status().message());
  remat::v1::SubmitSearchRequest request;
  *request.mutable_spec() = proto::ToProto(*spec);
  if (spec->search.backend == search::Backend::kReplay) {
    auto table = spec::LoadReplayTableFile(spec->search.replay_table);
    if (!table.ok()) return absl::InvalidArgumentError(table.status().message());
    auto* trials = request.mutable_replay_table()->mutable_trials();
    for (const auto& [policy, entry] : *table) {
      remat::v1::ReplayEntry e;
      *e.mutable_result() = proto::ToProto(entry.result);
      e.set_wall_s(entry.wall_s);
      (*trials)[policy] = std::move(e);
    }
  }
  return request;
}

}  // namespace remat::cli
