#include "src/control/controller/kv_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace holdfast::control {

KvStore::KvStore(KvLimits limits) : limits_(limits) {
  timer_ = std::thread([this] { TimerLoop(); });
}

KvStore::~KvStore() {
  std::map<uint64_t, Waiter> pending;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    pending.swap(waiters_);
  }
  timer_.join();
  for (auto& [id, w] : pending) {
    w.done(absl::UnavailableError("controller store shutting down"));
  }
}

absl::Status KvStore::CheckKey(absl::string_view key) const {
  if (key.empty()) return absl::InvalidArgumentError("empty key");
  if (key.size() > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key of ", key.size(), " bytes exceeds the limit of ",
                     limits_.max_key_bytes));
  }
  return absl::OkStatus();
}

absl::Status KvStore::CheckValue(absl::string_view value) const {
  if (value.size() > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value of ", value.size(), " bytes exceeds the limit of ",
                     limits_.max_value_bytes));
  }
  return absl::OkStatus();
}

bool KvStore::AllPresentLocked(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (data_.find(k) == data_.end()) return false;
  }
  return true;
}

std::vector<KvStore::WaitDone> KvStore::ReadyWaitersLocked() {
  std::vector<WaitDone> ready;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (AllPresentLocked(it->second.keys)) {
      ready.push_back(std::move(it->second.done));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

absl::Status KvStore::Set(absl::string_view key, absl::string_view value) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (absl::Status s = CheckValue(value); !s.ok()) return s;
  std::vector<WaitDone> ready;
  {
    absl::MutexLock lock(&mu_);
    data_[std::string(key)] = std::string(value);
    ready = ReadyWaitersLocked();
  }
  for (auto& done : ready) done(absl::OkStatus());
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> KvStore::Get(absl::string_view key) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

absl::StatusOr<int64_t> KvStore::Add(absl::string_view key, int64_t delta) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  std::vector<WaitDone> ready;
  int64_t value = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = data_.find(key);
    if (it != data_.end() && !absl::SimpleAtoi(it->second, &value)) {
      return absl::FailedPreconditionError(
          absl::StrCat("key '", key, "' does not hold a counter"));
    }
    if ((delta > 0 && value > INT64_MAX - delta) ||
        (delta < 0 && value < INT64_MIN - delta)) {
      return absl::OutOfRangeError(
          absl::StrCat("counter '", key, "' would overflow"));
    }
    value += delta;
    data_[std::string(key)] = absl::StrCat(value);
    ready = ReadyWaitersLocked();
  }
  for (auto& done : ready) done(absl::OkStatus());
  return value;
}

absl::StatusOr<std::pair<bool, std::string>> KvStore::CompareAndSet(
    absl::string_view key, absl::string_view expected, bool expect_absent,
    absl::string_view desired) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (absl::Status s = CheckValue(desired); !s.ok()) return s;
  std::vector<WaitDone> ready;
  std::pair<bool, std::string> result;
  {
    absl::MutexLock lock(&mu_);
    auto it = data_.find(key);
    const bool matches = expect_absent
                             ? it == data_.end()
                             : it != data_.end() && it->second == expected;
    if (matches) {
      data_[std::string(key)] = std::string(desired);
      result = {true, std::string(desired)};
      ready = ReadyWaitersLocked();
    } else {
      result = {false, it == data_.end() ? std::string() : it->second};
    }
  }
  for (auto& done : ready) done(absl::OkStatus());
  return result;
}

absl::StatusOr<int64_t> KvStore::DeletePrefix(absl::string_view prefix) {
  if (prefix.empty()) {
    return absl::InvalidArgumentError(
        "empty prefix (it would delete every key)");
  }
  if (absl::Status s = CheckKey(prefix); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (auto it = data_.lower_bound(prefix);
       it != data_.end() &&
       absl::string_view(it->first).substr(0, prefix.size()) == prefix;) {
    it = data_.erase(it);
    ++n;
  }
  return n;
}

uint64_t KvStore::NewWaitId() {
  absl::MutexLock lock(&mu_);
  return next_wait_id_++;
}

void KvStore::WaitAsync(uint64_t id, std::vector<std::string> keys,
                        absl::Duration timeout, WaitDone done) {
  absl::Status bad;
  if (keys.empty() || keys.size() > limits_.max_wait_keys) {
    bad = absl::InvalidArgumentError(absl::StrCat("a wait needs 1 to ",
                                                  limits_.max_wait_keys,
                                                  " keys, got ", keys.size()));
  } else if (timeout < absl::ZeroDuration() || timeout > limits_.max_wait) {
    bad = absl::InvalidArgumentError(
        absl::StrCat("wait timeout must be in [0, ",
                     absl::FormatDuration(limits_.max_wait), "]"));
  }
  for (const auto& k : keys) {
    if (!bad.ok()) break;
    bad = CheckKey(k);
  }
  if (!bad.ok()) {
    done(bad);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (stop_) {
      bad = absl::UnavailableError("controller store shutting down");
    } else if (!AllPresentLocked(keys)) {
      waiters_[id] =
          Waiter{std::move(keys), absl::Now() + timeout, std::move(done)};
      ++epoch_;
      return;
    }
  }
  done(bad);  // OK: all present already
}

void KvStore::CancelWait(uint64_t id) {
  WaitDone done;
  {
    absl::MutexLock lock(&mu_);
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;
    done = std::move(it->second.done);
    waiters_.erase(it);
  }
  done(absl::CancelledError("wait cancelled by the caller"));
}

void KvStore::TimerLoop() {
  for (;;) {
    std::vector<std::pair<WaitDone, absl::Status>> expired;
    {
      absl::MutexLock lock(&mu_);
      absl::Time next = absl::InfiniteFuture();
      for (const auto& [id, w] : waiters_) next = std::min(next, w.deadline);
      const uint64_t seen = epoch_;
      auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || epoch_ != seen;
      };
      mu_.AwaitWithDeadline(absl::Condition(&changed), next);
      if (stop_) return;
      const absl::Time now = absl::Now();
      for (auto it = waiters_.begin(); it != waiters_.end();) {
        if (it->second.deadline > now) {
          ++it;
          continue;
        }
        std::vector<std::string> missing;
        for (const auto& k : it->second.keys) {
          if (data_.find(k) == data_.end()) missing.push_back(k);
        }
        expired.emplace_back(std::move(it->second.done),
                             absl::DeadlineExceededError(absl::StrCat(
                                 "keys [", absl::StrJoin(missing, ", "),
                                 "] did not appear in time")));
        it = waiters_.erase(it);
      }
    }
    for (auto& [done, status] : expired) done(status);
  }
}

}  // namespace holdfast::control
