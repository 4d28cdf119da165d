#include "common/main_util.h"

#include <pthread.h>
#include <signal.h>

#include <unistd.h>

#include <ctime>
#include <exception>
#include <filesystem>
#include <iostream>
#include <new>

namespace remat::common {

std::string HostPortProblem(const std::string& flag, const std::string& value) {
  const auto colon = value.rfind(':');
  const std::string port = colon == std::string::npos ? "" : value.substr(colon + 1);
  const bool digits = !port.empty() && port.size() <= 5 &&
                      port.find_first_not_of("0123456789") == std::string::npos;
  if (colon == std::string::npos || colon == 0 || !digits || std::stoi(port) > 65535) {
    return flag + ": expected HOST:PORT (port 0 picks a free one), got \"" + value + "\"";
  }
  return "";
}
namespace {

sigset_t StopSet(bool with_hangup) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  if (with_hangup) sigaddset(&set, SIGHUP);
  return set;
}

// An exception's text as part of one error line.
std::string OneLine(const char* what) {
  std::string out(what != nullptr ? what : "");
  if (out.size() > 300) out = out.substr(0, 300) + "...";
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

std::string DescribeCurrentException() {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return "out of memory";
  } catch (const std::exception& e) {
    return "internal error: " + OneLine(e.what());
  } catch (...) {
    return "internal error: unknown exception";
  }
}

[[noreturn]] void OnTerminate() {
  std::string line = "error: ";
  line += std::current_exception() ? DescribeCurrentException() : "internal error: terminated";
  line += "\n";
  // Not iostreams: other threads may hold them.
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, line.data(), line.size());
  _exit(1);
}

}  // namespace

int GuardedMain(const std::function<int()>& body) {
  std::set_terminate(OnTerminate);
  try {
    return body();
  } catch (...) {
    return Fail(1, DescribeCurrentException());
  }
}

int Fail(int code, const std::string& message) {
  std::cerr << "error: " << message << std::endl;
  return code;
}

std::string SelfDir() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

StopSignals::StopSignals(Hangup hangup) : take_hangup_(hangup == kReloadOnHangup) {
  const sigset_t set = StopSet(take_hangup_);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

StopSignals::~StopSignals() { Finish(); }

void StopSignals::Finish() {
  done_ = true;
  if (waiter_.joinable()) waiter_.join();
}

void StopSignals::OnStop(std::function<void(int)> on_stop, std::function<void()> on_reload) {
  waiter_ = std::thread([this, on_stop = std::move(on_stop), on_reload = std::move(on_reload)] {
    const sigset_t set = StopSet(take_hangup_);
    // A short timed wait rather than sigwait, so the destructor ends the waiter by a flag, with
    // no signal sent to the process.
    const timespec tick{0, 100 * 1000 * 1000};
    while (!done_.load()) {
      const int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig == SIGHUP) {
        if (on_reload && !done_.load()) on_reload();
        continue;
      }
      if (sig > 0) {
        if (!done_.load()) on_stop(sig);
        return;
      }
    }
  });
}

}  // namespace remat::common
