#include "src/checkpoint/pieces.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <new>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "src/checkpoint/xxh3_variants.h"

namespace holdfast::pieces {
namespace {

namespace fs = std::filesystem;

// Format 2 carries the ledger; format 1 (without it) is refused by name.
constexpr char kMagic[8] = {'H', 'F', 'P', 'I', 'E', 'C', 'E', '2'};
constexpr char kMagicV1[8] = {'H', 'F', 'P', 'I', 'E', 'C', 'E', '1'};

// The header as it lies on disk (little-endian hosts only, like the rest of
// the wire formats here).
struct DiskHeader {
  char magic[8];
  int64_t step;
  int64_t layout_generation;
  int32_t world;
  int32_t slot;
  uint64_t layout_hash;
  uint64_t bytes;
  uint64_t checksum;
  int64_t ledger[kLedgerWords];
};
static_assert(sizeof(DiskHeader) == 80, "the header layout is fixed");

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const void* data, size_t bytes,
                      const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("writing", path);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Reads up to `bytes`; returns how many were read (short at end of file).
absl::StatusOr<size_t> ReadAll(int fd, void* data, size_t bytes,
                               const std::string& path) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n =
        ::read(fd, p + done, std::min<size_t>(bytes - done, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("reading", path);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

void FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

// step-<n> -> n; -1 for any other name.
int64_t StepOfDir(const std::string& name) {
  int64_t step;
  if (name.rfind("step-", 0) != 0 || !absl::SimpleAtoi(name.substr(5), &step)) {
    return -1;
  }
  return step;
}

absl::Status ReadHeader(int fd, const std::string& path, DiskHeader* h) {
  absl::StatusOr<size_t> n = ReadAll(fd, h, sizeof(*h), path);
  if (!n.ok()) return n.status();
  if (*n >= sizeof(kMagicV1) &&
      std::memcmp(h->magic, kMagicV1, sizeof(kMagicV1)) == 0) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint piece ", path,
        " is in format 1, which this holdfast no longer reads (written "
        "before pieces carried the ledger); start the job without it"));
  }
  if (*n != sizeof(*h) || std::memcmp(h->magic, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(
        absl::StrCat("checkpoint piece ", path,
                     " is not a holdfast piece (bad or short header)"));
  }
  return absl::OkStatus();
}

}  // namespace

Range Partition(size_t total, size_t unit, int parts, int part) {
  if (parts <= 0 || part < 0 || part >= parts || unit == 0) return {};
  const size_t units = total / unit;
  const size_t base = units / static_cast<size_t>(parts);
  const size_t extra = units % static_cast<size_t>(parts);
  const size_t p = static_cast<size_t>(part);
  const size_t first = p * base + std::min(p, extra);
  const size_t count = base + (p < extra ? 1 : 0);
  return {first * unit, count * unit};
}

Range Intersect(const Range& a, const Range& b) {
  const size_t lo = std::max(a.offset, b.offset);
  const size_t hi = std::min(a.end(), b.end());
  if (hi <= lo) return {lo, 0};
  return {lo, hi - lo};
}

uint64_t Checksum(const void* data, size_t bytes) {
  return hf_xxh3_best()->hash(data, bytes);
}

struct CopyHasher::State {
  State() : xxh(hf_xxh3_best()), state(xxh->new_state()) {
    if (state == nullptr) throw std::bad_alloc();
  }
  ~State() { xxh->free_state(state); }
  const HfXxh3Variant* xxh;
  void* state;
};

CopyHasher::CopyHasher() : state_(std::make_unique<State>()) {}

CopyHasher::~CopyHasher() = default;

uint8_t* CopyHasher::Copy(uint8_t* dst, const uint8_t* src, size_t bytes) {
  // Small enough to stay in L2 between the copy and the hash.
  constexpr size_t kBlock = size_t{256} << 10;
  for (size_t off = 0; off < bytes; off += kBlock) {
    const size_t n = std::min(kBlock, bytes - off);
    std::memcpy(dst + off, src + off, n);
    state_->xxh->update(state_->state, dst + off, n);
  }
  return dst + bytes;
}

void CopyHasher::Update(const void* data, size_t bytes) {
  state_->xxh->update(state_->state, data, bytes);
}

uint64_t CopyHasher::Digest() const {
  return state_->xxh->digest(state_->state);
}

namespace {

// How well slot c suits as a buddy of slot s: 0, everything holds; 1,
// another failure domain but a shared parallel group or topology block;
// 2, the same failure domain.
class Tiers {
 public:
  explicit Tiers(const PlacementInput& in)
      : in_(in),
        group_(in.tp * in.pp),
        groups_(group_ > 1 && static_cast<int>(in.domain.size()) % group_ == 0),
        blocks_(in.block.size() == in.domain.size() &&
                std::any_of(in.block.begin(), in.block.end(),
                            [](uint64_t b) { return b != 0; })) {}

  int Of(int s, int c) const {
    const size_t si = static_cast<size_t>(s), ci = static_cast<size_t>(c);
    if (in_.domain[si] == in_.domain[ci]) return 2;
    if (!OutsideGroups(s, c)) return 1;
    if (blocks_ && in_.block[si] != 0 && in_.block[si] == in_.block[ci]) {
      return 1;
    }
    return 0;
  }
  // Whether tier 1 means anything here (there are groups or blocks).
  bool constrained() const { return groups_ || blocks_; }

 private:
  bool OutsideGroups(int a, int b) const {
    if (!groups_) return true;
    const int ta = a % in_.tp, tb = b % in_.tp;
    const int pa = (a / in_.tp) % in_.pp, pb = (b / in_.tp) % in_.pp;
    const int da = a / group_, db = b / group_;
    // Sharing a TP group: same (pp, dp); PP: same (tp, dp); DP: same
    // (tp, pp).
    return !((pa == pb && da == db) || (ta == tb && da == db) ||
             (ta == tb && pa == pb));
  }

  const PlacementInput& in_;
  const int group_;
  const bool groups_;
  const bool blocks_;
};

}  // namespace

Placement Place(const PlacementInput& in) {
  Placement out;
  const int world = static_cast<int>(in.domain.size());
  out.buddies.assign(static_cast<size_t>(world), {});
  if (world <= 1) return out;
  const int r = std::min(std::max(in.replicas, 0), world - 1);
  const size_t distinct =
      std::set<uint64_t>(in.domain.begin(), in.domain.end()).size();
  const int shift = std::max(1, world / static_cast<int>(distinct));
  const Tiers tiers(in);
  for (int s = 0; s < world; ++s) {
    std::vector<int>& chosen = out.buddies[static_cast<size_t>(s)];
    const auto full = [&] { return static_cast<int>(chosen.size()) >= r; };
    for (int t = 0; t <= 2 && !full(); ++t) {
      for (int k = 0; k < world && !full(); ++k) {
        const int c = (s + shift + k) % world;
        if (c == s || tiers.Of(s, c) > t ||
            std::find(chosen.begin(), chosen.end(), c) != chosen.end()) {
          continue;
        }
        chosen.push_back(c);
        if (t == 1 && tiers.constrained()) {
          out.warnings.push_back(absl::StrCat(
              "slot ", s, "'s copy on slot ", c,
              " shares a parallel group or topology block with it"));
        } else if (t == 2) {
          out.warnings.push_back(absl::StrCat("slot ", s, "'s copy on slot ", c,
                                              " is in its failure domain"));
        }
      }
    }
  }
  return out;
}

std::string PiecePath(const std::string& dir, int64_t step, int world,
                      int slot) {
  return absl::StrCat(dir, "/step-", step, "/piece-", slot, "-of-", world,
                      ".bin");
}

absl::Status WritePiece(const std::string& dir, const PieceHeader& header,
                        const void* data) {
  const std::string step_dir = absl::StrCat(dir, "/step-", header.step);
  std::error_code ec;
  fs::create_directories(step_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("creating ", step_dir, ": ", ec.message()));
  }
  const std::string path =
      PiecePath(dir, header.step, header.world, header.slot);
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Errno("creating", tmp);
  DiskHeader h;
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.step = header.step;
  h.layout_generation = header.layout_generation;
  h.world = header.world;
  h.slot = header.slot;
  h.layout_hash = header.layout_hash;
  h.bytes = header.bytes;
  h.checksum = header.checksum;
  std::copy(header.ledger.begin(), header.ledger.end(), h.ledger);
  absl::Status s = WriteAll(fd, &h, sizeof(h), tmp);
  if (s.ok()) s = WriteAll(fd, data, header.bytes, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = Errno("syncing", tmp);
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = Errno("renaming onto", path);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  FsyncDir(step_dir);
  return absl::OkStatus();
}

absl::Status ReadPiece(const std::string& path, uint64_t layout_hash,
                       PieceHeader* header, std::vector<uint8_t>* data) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    return absl::DataLossError(
        absl::StrCat("checkpoint piece ", path,
                     " cannot be opened: ", std::strerror(errno)));
  }
  DiskHeader h;
  absl::Status s = ReadHeader(fd, path, &h);
  if (s.ok() && h.layout_hash != layout_hash) {
    s = absl::DataLossError(absl::StrCat(
        "checkpoint piece ", path, " was written with another state layout"));
  }
  if (s.ok()) {
    data->resize(h.bytes);
    absl::StatusOr<size_t> n = ReadAll(fd, data->data(), h.bytes, path);
    if (!n.ok()) {
      s = n.status();
    } else if (*n != h.bytes) {
      s = absl::DataLossError(absl::StrCat("checkpoint piece ", path,
                                           " is truncated: ", *n, " of ",
                                           h.bytes, " bytes"));
    } else if (Checksum(data->data(), data->size()) != h.checksum) {
      s = absl::DataLossError(absl::StrCat("checkpoint piece ", path,
                                           " failed its checksum (xxh3 ",
                                           Checksum(data->data(), data->size()),
                                           ", expected ", h.checksum, ")"));
    }
  }
  ::close(fd);
  if (!s.ok()) return s;
  header->step = h.step;
  header->layout_generation = h.layout_generation;
  header->world = h.world;
  header->slot = h.slot;
  header->layout_hash = h.layout_hash;
  header->bytes = h.bytes;
  header->checksum = h.checksum;
  std::copy(h.ledger, h.ledger + kLedgerWords, header->ledger.begin());
  return absl::OkStatus();
}

absl::StatusOr<std::optional<DiskStep>> FindNewest(
    const std::string& dir, std::optional<uint64_t> layout_hash) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::optional<DiskStep>();
  std::map<int64_t, std::string, std::greater<>> steps;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t step = StepOfDir(e.path().filename().string());
    if (step >= 0 && e.is_directory()) steps[step] = e.path().string();
  }
  std::string other_layout;
  for (const auto& [step, path] : steps) {
    // (layout, world) -> slots found
    std::map<std::pair<uint64_t, int>, std::set<int>> found;
    for (const auto& f : fs::directory_iterator(path, ec)) {
      const std::string name = f.path().filename().string();
      std::vector<std::string> parts = absl::StrSplit(name, '-');
      int slot, world;
      if (parts.size() != 4 || parts[0] != "piece" || parts[2] != "of" ||
          !absl::StrContains(parts[3], ".bin") ||
          absl::StrContains(parts[3], ".tmp") ||
          !absl::SimpleAtoi(parts[1], &slot) ||
          !absl::SimpleAtoi(parts[3].substr(0, parts[3].size() - 4), &world)) {
        continue;
      }
      const int fd = ::open(f.path().c_str(), O_RDONLY);
      if (fd < 0) continue;
      DiskHeader h;
      absl::Status s = ReadHeader(fd, f.path().string(), &h);
      ::close(fd);
      if (!s.ok() || h.step != step || h.world != world || h.slot != slot) {
        continue;
      }
      if (layout_hash.has_value() && h.layout_hash != *layout_hash) {
        other_layout = path;
        continue;
      }
      found[{h.layout_hash, world}].insert(slot);
    }
    for (const auto& [key, slots] : found) {
      const int world = key.second;
      if (static_cast<int>(slots.size()) == world) {
        return std::optional<DiskStep>(DiskStep{step, world});
      }
    }
  }
  if (!other_layout.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the disk checkpoint in ", other_layout,
        " was written with another state layout (names, kinds or sizes); "
        "remove it or point HOLDFAST_CHECKPOINT_DIR elsewhere"));
  }
  return std::optional<DiskStep>();
}

void Prune(const std::string& dir, int keep) {
  std::error_code ec;
  std::map<int64_t, fs::path, std::greater<>> steps;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t step = StepOfDir(e.path().filename().string());
    if (step >= 0) steps[step] = e.path();
  }
  int n = 0;
  for (const auto& [step, path] : steps) {
    if (++n > keep) fs::remove_all(path, ec);
  }
}

void RemoveAfter(const std::string& dir, int64_t step) {
  std::error_code ec;
  std::vector<fs::path> newer;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (StepOfDir(e.path().filename().string()) > step) {
      newer.push_back(e.path());
    }
  }
  for (const fs::path& p : newer) fs::remove_all(p, ec);
}

}  // namespace holdfast::pieces
