// Status helpers for server/: conversion from search::Status, and early-return macros.
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "search/status.h"

namespace remat::server {

// search::Status (standard-library errors of search/) as absl::Status, code for code.
absl::Status ToAbsl(const search::Status& status);

}  // namespace remat::server

#define REMAT_STATUS_CONCAT_INNER_(a, b) a##b
#define REMAT_STATUS_CONCAT_(a, b) REMAT_STATUS_CONCAT_INNER_(a, b)

// Returns the absl::Status of `expr` from the calling function when it is not ok.
#define REMAT_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status remat_status_ = (expr);         \
    if (!remat_status_.ok()) return remat_status_; \
  } while (0)

// `REMAT_ASSIGN_OR_RETURN(auto x, MakeX());`: assigns the value or returns the error.
#define REMAT_ASSIGN_OR_RETURN(lhs, expr) \
  REMAT_ASSIGN_OR_RETURN_IMPL_(REMAT_STATUS_CONCAT_(remat_statusor_, __LINE__), lhs, expr)
#define REMAT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
