#include "worker/assignment.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "common/read_file.h"
#include "google/protobuf/unknown_field_set.h"
#include "proto/convert.h"
#include "search/limits.h"
#include "search/text.h"

namespace remat::worker {

Assignment ToAssignment(const v1::TrialAssignment& msg) {
  Assignment a;
  a.search_id = msg.search_id();
  a.trial_id = msg.trial_id();
  a.attempt = msg.attempt();
  a.world_size = std::max(1, msg.world_size());
  a.policy_name = msg.policy().canonical();
  a.owner = msg.owner();
  auto spec = proto::FromProto(msg.spec());
  if (!spec.ok()) {
    a.error = "assignment: " + spec.status().message();
    return a;
  }
  a.spec = std::move(spec).value();
  auto policy = search::ParsePolicy(a.policy_name);
  if (!policy.ok()) {
    a.error = "assignment: policy: " + policy.status().message();
    return a;
  }
  a.policy = *policy;
  if (msg.replay_found()) {
    const v1::TrialResult& entry = msg.replay().result();
    a.replay = ResultFromWire(entry);
    if (!proto::FromProto(entry.status()) && a.replay->message.empty()) {
      a.replay->message = "replay entry has no final status";
    }
  }
  a.replay_wall_s = msg.replay().wall_s();
  return a;
}

search::TrialResult ResultFromWire(const v1::TrialResult& msg) {
  v1::TrialResult copy = msg;
  // The policy is named elsewhere (MakeReport stamps it); any parsable one lets FromProto read
  // the rest.
  copy.mutable_policy()->set_canonical(search::Policy::None().ToString());
  if (!proto::FromProto(copy.status())) copy.set_status(v1::TRIAL_STATUS_FAILED);
  return proto::FromProto(copy).value();
}

search::TrialResult StatusResult(search::TrialStatus status, std::string message) {
  search::TrialResult result;
  result.status = status;
  result.message = std::move(message);
  return result;
}

v1::ReportTrialRequest MakeReport(const std::string& worker_id, const Assignment& assignment,
                                  const search::TrialResult& result) {
  v1::ReportTrialRequest report;
  report.set_worker_id(worker_id);
  report.set_trial_id(assignment.trial_id);
  report.set_attempt(assignment.attempt);
  *report.mutable_result() = proto::ToProto(result);
  // What trials wrote (stderr tails, their own messages) may be any bytes: a proto3 string with
  // invalid UTF-8 makes the coordinator refuse the whole report, and megabytes would crowd it.
  report.mutable_result()->set_message(
      search::BoundedUtf8(result.message, search::limits::kMaxTrialMessageBytes));
  report.mutable_result()->mutable_policy()->set_canonical(assignment.policy_name);
  return report;
}

namespace {

// Makes every string field of a serialized message of type `type` valid UTF-8, recursing into
// message fields (map entries included), from the wire format alone: a proto3 message with one
// invalid string does not parse at all. False when `bytes` is not a message.
bool RepairUtf8(const google::protobuf::Descriptor& type, std::string* bytes, int depth) {
  if (depth > 16) return false;
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromString(*bytes)) return false;
  for (int i = 0; i < fields.field_count(); ++i) {
    google::protobuf::UnknownField* f = fields.mutable_field(i);
    if (f->type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const google::protobuf::FieldDescriptor* fd = type.FindFieldByNumber(f->number());
    if (fd == nullptr) continue;
    std::string* value = f->mutable_length_delimited();
    if (fd->type() == google::protobuf::FieldDescriptor::TYPE_STRING) {
      // Room for a U+FFFD (3 bytes) per invalid byte: repaired, never cut.
      if (!search::IsValidUtf8(*value)) {
        *value = search::BoundedUtf8(*value, value->size() * 3 + 64);
      }
    } else if (fd->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
      if (!RepairUtf8(*fd->message_type(), value, depth + 1)) return false;
    }
  }
  bytes->clear();
  return fields.SerializeToString(bytes);
}

}  // namespace

bool ReadResultFile(const std::string& path, v1::TrialResult* out) {
  common::FileText file = common::ReadRegularFile(path, search::limits::kMaxResultFileBytes);
  if (!file.text) return false;
  if (!out->ParseFromString(*file.text)) {
    std::string repaired = *file.text;
    if (!RepairUtf8(*v1::TrialResult::descriptor(), &repaired, 0) ||
        !out->ParseFromString(repaired)) {
      return false;
    }
  }
  return out->status() != v1::TRIAL_STATUS_UNSPECIFIED;
}

std::string RequestPath(const std::string& dir, int rank) {
  return (std::filesystem::path(dir) / ("request-" + std::to_string(rank) + ".pb")).string();
}

std::string WriteTrialRequests(const Assignment& a, const std::string& dir,
                               double collective_timeout_s) {
  namespace fs = std::filesystem;
  const fs::path rendezvous = fs::path(dir) / "rendezvous";
  std::error_code ec;
  fs::create_directories(rendezvous, ec);
  if (ec) return "cannot create " + rendezvous.string() + ": " + ec.message();
  const v1::SearchSpec wire_spec = proto::ToProto(a.spec);
  for (int r = 0; r < a.world_size; ++r) {
    v1::TrialRequest request;
    *request.mutable_spec() = wire_spec;
    request.mutable_policy()->set_canonical(a.policy_name);
    request.set_rank(r);
    request.set_world_size(a.world_size);
    request.set_rendezvous_dir(rendezvous.string());
    request.set_collective_timeout_s(collective_timeout_s);
    const std::string path = RequestPath(dir, r);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out || !request.SerializeToOstream(&out)) return "cannot write " + path;
  }
  return "";
}

}  // namespace remat::worker
