#include "server/session.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace hostkv {

Session::Session(uint64_t id, OwnerTag tag, std::string client_name,
                 uint32_t pid, std::shared_ptr<SignalBoard> signals)
    : id_(id),
      tag_(tag),
      client_name_(std::move(client_name)),
      pid_(pid),
      opened_(absl::Now()),
      signals_(std::move(signals)),
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

uint64_t Session::AddImport(std::shared_ptr<DeviceImport> import) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = ++next_import_;
  imports_[id] = std::move(import);
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
  return it->second;
}

absl::Status Session::RemoveImport(uint64_t id) {
  absl::MutexLock lock(&mu_);
  if (imports_.erase(id) == 0) {
    return absl::NotFoundError(
        absl::StrCat("the session has no device-buffer import ", id));
  }
  return absl::OkStatus();
}

std::vector<std::shared_ptr<DeviceImport>> Session::Imports() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<DeviceImport>> out;
  for (const auto& [id, import] : imports_) out.push_back(import);
  return out;
}

std::vector<std::shared_ptr<DeviceImport>> Session::TakeImports() {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<DeviceImport>> out;
  for (auto& [id, import] : imports_) out.push_back(std::move(import));
  imports_.clear();
  return out;
}

std::map<std::string, uint32_t> Session::ImportsByPool() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, uint32_t> counts;
  for (const auto& [id, import] : imports_) ++counts[import->pool()->name()];
  return counts;
}

}  // namespace hostkv
