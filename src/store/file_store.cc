// FileStore: one file per key in a shared directory. Set writes a temporary
// file and renames it into place, so readers never see a partial value.
// Get polls for the file with a short back-off (as Gloo's FileStore does).
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "holdfast/store.h"

namespace holdfast {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat("file store: ", what, " '", path, "': ", strerror(errno)));
}

// Keys may hold any byte; file names get [A-Za-z0-9._-] and %XX for the rest.
std::string EncodeKey(absl::string_view key) {
  std::string out;
  for (unsigned char c : key) {
    if (isalnum(c) || c == '.' || c == '_' || c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      static const char* kHex = "0123456789ABCDEF";
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

class FileStore final : public Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override {
    if (key.empty()) return absl::InvalidArgumentError("store: empty key");
    const std::string path = Path(key);
    static std::atomic<uint64_t> counter{0};
    const std::string tmp =
        absl::StrCat(dir_, "/.tmp.", getpid(), ".", counter.fetch_add(1));
    int fd =
        ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Errno("open", tmp);
    size_t done = 0;
    while (done < value.size()) {
      ssize_t n = ::write(fd, value.data() + done, value.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        absl::Status s = Errno("write", tmp);
        ::close(fd);
        ::unlink(tmp.c_str());
        return s;
      }
      done += static_cast<size_t>(n);
    }
    ::close(fd);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      absl::Status s = Errno("rename", path);
      ::unlink(tmp.c_str());
      return s;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override {
    if (key.empty()) return absl::InvalidArgumentError("store: empty key");
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration backoff = absl::Microseconds(200);
    for (;;) {
      absl::StatusOr<std::optional<std::string>> v = TryGet(key);
      if (!v.ok()) return v.status();
      if (v->has_value()) return std::move(**v);
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "store: key '", key, "' did not appear within ",
            absl::FormatDuration(timeout), " (file store ", dir_, ")"));
      }
      absl::SleepFor(std::min(backoff, deadline - absl::Now()));
      backoff = std::min(backoff * 2, absl::Milliseconds(10));
    }
  }

  absl::StatusOr<std::optional<std::string>> TryGet(
      absl::string_view key) override {
    const std::string path = Path(key);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return std::optional<std::string>();
      return Errno("open", path);
    }
    std::string out;
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        absl::Status s = Errno("read", path);
        ::close(fd);
        return s;
      }
      if (n == 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return std::optional<std::string>(std::move(out));
  }

 private:
  std::string Path(absl::string_view key) const {
    return absl::StrCat(dir_, "/", EncodeKey(key));
  }
  const std::string dir_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Store>> NewFileStore(const std::string& dir) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("file store: empty directory path");
  }
  // mkdir -p
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos == dir.size() || dir[pos] == '/') {
      std::string part = dir.substr(0, pos);
      if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
        return Errno("mkdir", part);
      }
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("file store: '", dir, "' is not a directory"));
  }
  return std::shared_ptr<Store>(std::make_shared<FileStore>(dir));
}

}  // namespace holdfast
