// Status and StatusOr for search/: errors as values, standard library only.
//
// search/ may not depend on abseil (it is pure decision logic, linked by the trial engine on GPU
// nodes that lack gRPC), so it carries this small equivalent. Callers at the service boundary
// convert it to absl::Status. Thread-safety: plain values.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace remat::search {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad input: the message names the field ("model.hidden_size: ...")
  kFailedPrecondition,
  kNotFound,
  kInternal,
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgument(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}
inline Status FailedPrecondition(std::string message) {
  return Status(StatusCode::kFailedPrecondition, std::move(message));
}
inline Status NotFound(std::string message) {
  return Status(StatusCode::kNotFound, std::move(message));
}
inline Status Internal(std::string message) {
  return Status(StatusCode::kInternal, std::move(message));
}

// A value or the Status that explains why there is none.
template <typename T>
class StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit like absl::StatusOr
  StatusOr(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  const T& value() const& { assert(ok()); return *value_; }
  T& value() & { assert(ok()); return *value_; }
  T&& value() && { assert(ok()); return std::move(*value_); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace remat::search

// Returns early from the calling function when `expr` is not ok.
#define REMAT_SEARCH_RETURN_IF_ERROR(expr)              \
  do {                                                  \
    ::remat::search::Status remat_status_ = (expr);     \
    if (!remat_status_.ok()) return remat_status_;      \
  } while (0)
