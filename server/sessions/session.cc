#include "server/sessions/session.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hostkv {

bool PeerCredentials::InGroup(uint32_t g) const {
  return gid == g || std::find(groups.begin(), groups.end(), g) != groups.end();
}

Session::Session(SessionId id, OwnerTag tag, std::string client_name,
                 uint32_t pid, std::shared_ptr<SignalBoard> signals,
                 BudgetReservation memory)
    : id_(std::move(id)),
      tag_(tag),
      client_name_(std::move(client_name)),
      pid_(pid),
      opened_(absl::Now()),
      signals_(std::move(signals)),
      memory_(std::move(memory)),
      last_active_ns_(absl::GetCurrentTimeNanos()) {}

absl::Status Session::Attach(const PeerCredentials& peer) {
  absl::MutexLock lock(&mu_);
  if (peer_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", tag_, " already has an attached socket"));
  }
  peer_ = peer;
  return absl::OkStatus();
}

bool Session::attached() const {
  absl::MutexLock lock(&mu_);
  return peer_.has_value();
}

std::optional<PeerCredentials> Session::peer() const {
  absl::MutexLock lock(&mu_);
  return peer_;
}

absl::StatusOr<uint64_t> Session::AddImport(
    std::shared_ptr<DeviceImport> import, uint64_t bytes, uint32_t max_imports,
    uint64_t max_bytes, uint64_t wanted) {
  absl::MutexLock lock(&mu_);
  if (imports_.size() >= max_imports) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the session already holds ", imports_.size(),
        " device-buffer imports, the most --max_imports_per_session allows; "
        "unregister some first"));
  }
  if (bytes > max_bytes || import_bytes_ > max_bytes - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the import would bring the session's imported device bytes to ",
        import_bytes_ + bytes, ", above --max_import_bytes_per_session (",
        max_bytes, ")"));
  }
  if (wanted != 0 && imports_.contains(wanted)) {
    return absl::AlreadyExistsError(
        absl::StrCat("the session has an import ", wanted, " already"));
  }
  const uint64_t id = wanted != 0 ? wanted : ++next_import_;
  next_import_ = std::max(next_import_, id);
  imports_[id] = ImportEntry{std::move(import), bytes};
  import_bytes_ += bytes;
  return id;
}

absl::StatusOr<std::shared_ptr<DeviceImport>> Session::GetImport(
    uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = imports_.find(id);
  if (it == imports_.end()) {
    return absl::NotFoundError(
        absl::StrCat("the session has no device-buffer import ", id));
  }
  return it->second.import;
}

absl::Status Session::RemoveImport(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = imports_.find(id);
  if (it == imports_.end()) {
    return absl::NotFoundError(
        absl::StrCat("the session has no device-buffer import ", id));
  }
  import_bytes_ -= it->second.bytes;
  imports_.erase(it);
  return absl::OkStatus();
}

std::vector<std::shared_ptr<DeviceImport>> Session::Imports() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<DeviceImport>> out;
  for (const auto& [id, entry] : imports_) out.push_back(entry.import);
  return out;
}

std::vector<std::shared_ptr<DeviceImport>> Session::TakeImports() {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<DeviceImport>> out;
  for (auto& [id, entry] : imports_) out.push_back(std::move(entry.import));
  imports_.clear();
  import_bytes_ = 0;
  passed_fds_.clear();  // the mappings made from them stay valid
  return out;
}

std::map<std::string, uint32_t> Session::ImportsByPool() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, uint32_t> counts;
  for (const auto& [id, entry] : imports_) {
    ++counts[entry.import->pool()->name()];
  }
  return counts;
}

uint32_t Session::import_count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(imports_.size());
}

absl::StatusOr<uint64_t> Session::AddPassedFd(ScopedFd fd, uint32_t max,
                                              uint64_t wanted) {
  absl::MutexLock lock(&mu_);
  if (passed_fds_.size() >= max) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the session already passed ", passed_fds_.size(),
        " descriptors, the most --max_imports_per_session allows"));
  }
  if (wanted != 0 && passed_fds_.contains(wanted)) {
    return absl::AlreadyExistsError(
        absl::StrCat("the session has a passed descriptor ", wanted, " already"));
  }
  const uint64_t handle = wanted != 0 ? wanted : ++next_fd_handle_;
  next_fd_handle_ = std::max(next_fd_handle_, handle);
  passed_fds_.emplace(handle, std::move(fd));
  return handle;
}

absl::StatusOr<ScopedFd> Session::DupPassedFd(uint64_t handle) const {
  absl::MutexLock lock(&mu_);
  auto it = passed_fds_.find(handle);
  if (it == passed_fds_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "the session passed no descriptor with handle ", handle));
  }
  ScopedFd dup(fcntl(it->second.get(), F_DUPFD_CLOEXEC, 0));
  if (dup.get() < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot duplicate a passed descriptor: ", std::strerror(errno)));
  }
  return dup;
}

uint32_t Session::passed_fds() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(passed_fds_.size());
}

}  // namespace hostkv
