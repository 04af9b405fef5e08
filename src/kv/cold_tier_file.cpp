#include "kv/cold_tier_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <system_error>

namespace kvpack::kv {

using cold::kNoSlot;
using cold::Slot;

namespace {

std::runtime_error path_error(const std::string& what, const std::string& path, int err) {
  return std::runtime_error("cold tier: " + what + " " + path + ": " + std::strerror(err));
}

uint64_t fresh_generation() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return r ^ static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
         (static_cast<uint64_t>(::getpid()) << 48);
}

// Creates `dir` if needed, then opens, locks, empties and sizes the data file in it.
cold::UniqueFd open_data_file(const std::string& dir, const std::string& path, uint64_t file_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cold tier: cannot create directory " + dir + ": " + ec.message());
  if (!std::filesystem::is_directory(dir, ec)) throw std::runtime_error("cold tier: " + dir + " is not a directory");
  // O_NOFOLLOW: a symlink planted under our name must not make us truncate what it points to.
  cold::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) throw path_error("cannot open", path, errno);
  // Lock before truncating: a live tier's file must not be emptied under it. A killed process's lock
  // died with it.
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) throw std::runtime_error("cold tier: " + path + " is in use by another cold tier");
    throw path_error("cannot lock", path, err);
  }
  if (::ftruncate(fd.get(), 0) != 0) throw path_error("cannot truncate", path, errno);
  const auto size = static_cast<off_t>(file_bytes);
  if (::fallocate(fd.get(), 0, 0, size) != 0) {
    const int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) {
      ::unlink(path.c_str());  // ours, and empty: do not leave it behind
      throw std::runtime_error("cold tier: cannot reserve " + std::to_string(file_bytes) + " bytes for " + path +
                               ": " + std::strerror(err));
    }
    if (::ftruncate(fd.get(), size) != 0) throw path_error("cannot size", path, errno);  // sparse fallback
  }
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_RANDOM);  // slots are read by key, not in file order
  return fd;
}

// Direct reads: offsets, lengths and the buffer address aligned to 4 KiB (the largest logical block size
// in use; 512-byte devices accept it too).
constexpr size_t kDirectAlign = 4096;

size_t align_down(size_t x) { return x / kDirectAlign * kDirectAlign; }
size_t align_up(size_t x) { return (x + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

}  // namespace

void FileColdTier::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }
void SequentialReadProbe::FreeBuffer::operator()(uint8_t* p) const { std::free(p); }

FileColdTier::FileColdTier(const std::string& dir, uint64_t cap_bytes, size_t record_bytes, FileTierOptions options)
    : IndexedTier(record_bytes, cold::slots_within(cap_bytes, record_bytes, sizeof(SlotHeader) + record_bytes),
                  cap_bytes, options.read_threads),
      slot_bytes_(sizeof(SlotHeader) + record_bytes),
      generation_(fresh_generation()),
      path_((std::filesystem::path(dir) / kDataFileName).string()),
      max_write_batch_(std::clamp<size_t>(options.max_write_batch, 1, cold::kMaxIovecs)),
      readahead_hint_(options.readahead_hint),
      direct_even_if_cached_(options.direct_even_if_cached),
      direct_piece_slots_(std::max<size_t>(
          1, std::min(options.direct_read_bytes, options.direct_buffer_bytes / static_cast<size_t>(io_threads())) / slot_bytes_)) {
  const uint64_t file_bytes = static_cast<uint64_t>(index_.capacity()) * slot_bytes_;
  fd_ = open_data_file(dir, path_, file_bytes);
  if (options.direct_reads) {
    // A file system without O_DIRECT refuses the open (EINVAL) or, on some, the first read: both leave
    // the tier on buffered reads.
    direct_fd_ = cold::UniqueFd(::open(path_.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC | O_NOFOLLOW));
    if (direct_fd_) {
      // Address space only: the map is never read, so it costs no memory, and without it every run
      // counts as uncached (read direct), which is correct, only slower for a recent write.
      void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd_.get(), 0);
      if (map != MAP_FAILED) {
        map_ = map;
        map_bytes_ = file_bytes;
      }
      bounce_.resize(static_cast<size_t>(io_threads()));
      direct_ok_.store(true, std::memory_order_relaxed);
    }
  }
  const size_t n_entries = std::clamp<size_t>(options.staging_bytes / slot_bytes_, 2,
                                              static_cast<size_t>(std::max<int64_t>(2, index_.capacity())));
  stage_ = std::make_unique_for_overwrite<uint8_t[]>(n_entries * slot_bytes_);
  entries_.resize(n_entries);
  for (size_t e = n_entries; e-- > 0;) free_entries_.push_back(static_cast<int>(e));
  writer_ = std::thread([this] { writer_loop(); });
}

FileColdTier::~FileColdTier() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;  // the writer drains the queue before it exits
  }
  work_cv_.notify_all();
  writer_.join();
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  ::unlink(path_.c_str());  // a cache: useless to the next process, which would truncate it anyway
}

void FileColdTier::release_entry(int entry) {
  entries_[static_cast<size_t>(entry)] = StageEntry{};
  free_entries_.push_back(entry);
}

void FileColdTier::supersede_staged(Slot s) {
  const int e = staged_entry_[static_cast<size_t>(s)];
  if (e >= 0 && entries_[static_cast<size_t>(e)].state == StageState::kQueued) {
    entries_[static_cast<size_t>(e)].state = StageState::kCancelled;  // the writer skips and frees it
  }
  staged_entry_[static_cast<size_t>(s)] = -1;
}

Slot FileColdTier::put_one(uint64_t key, const uint8_t* data, Slot preferred) {
  std::unique_lock lock(mu_);
  ++stats_.puts;
  if (free_entries_.empty()) {
    ++io_.put_waits;
    progress_cv_.wait(lock, [&] { return !free_entries_.empty(); });
  }
  const int e = free_entries_.back();
  free_entries_.pop_back();
  entries_[static_cast<size_t>(e)].state = StageState::kFilling;  // ours alone until queued
  lock.unlock();

  uint8_t* buf = stage_buffer(e);
  const SlotHeader header{kMagic, static_cast<uint32_t>(record_bytes_), generation_, key,
                          cold::record_checksum(key, {data, record_bytes_}, generation_)};
  std::memcpy(buf, &header, sizeof header);
  std::memcpy(buf + sizeof header, data, record_bytes_);

  lock.lock();
  Slot s = index_.find(key);
  if (s != kNoSlot) {
    index_.touch(s);  // replacing: same slot, pin state kept
  } else {
    const cold::SlotIndex::Allocation a = index_.allocate(key, preferred);
    if (a.slot == kNoSlot) {  // every record is pinned
      release_entry(e);
      ++stats_.put_failures;
      lock.unlock();
      progress_cv_.notify_all();
      return kNoSlot;
    }
    stats_.evictions += a.evicted;
    s = a.slot;
    if (staged_entry_.size() < static_cast<size_t>(index_.slots_touched())) {
      staged_entry_.resize(index_.slots_touched(), -1);
      version_.resize(index_.slots_touched(), 0);
    }
  }
  supersede_staged(s);
  staged_entry_[static_cast<size_t>(s)] = e;
  ++version_[static_cast<size_t>(s)];
  entries_[static_cast<size_t>(e)] = StageEntry{s, StageState::kQueued};
  queue_.push_back(e);
  stats_.bytes_written += record_bytes_;
  lock.unlock();
  work_cv_.notify_one();
  return s;
}

bool FileColdTier::put(uint64_t key, std::span<const uint8_t> data) {
  if (data.size() != record_bytes_) throw std::invalid_argument("cold tier put: record of the wrong size");
  return put_one(key, data.data(), kNoSlot) != kNoSlot;
}

void FileColdTier::put_many(std::span<const uint64_t> keys, std::span<const uint8_t* const> data, std::span<bool> ok) {
  cold::check_batch(keys.size(), data.size(), ok.size(), "put_many");
  Slot previous = kNoSlot;
  for (size_t i = 0; i < keys.size(); ++i) {
    // Ask for the slot after the previous record's: a batch of new keys lands in consecutive slots
    // while they are free, and comes back with one preadv.
    const Slot s = put_one(keys[i], data[i], previous == kNoSlot ? kNoSlot : previous + 1);
    ok[i] = s != kNoSlot;
    if (ok[i]) previous = s;
  }
}

// The writer: takes queued entries in put order, writes runs of consecutive slots with one pwritev each.
void FileColdTier::writer_loop() {
  std::vector<int> batch;
  std::vector<bool> written;
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything staged is written
    batch.clear();
    while (!queue_.empty() && batch.size() < max_write_batch_) {
      const int e = queue_.front();
      queue_.pop_front();
      if (entries_[static_cast<size_t>(e)].state == StageState::kCancelled) {
        release_entry(e);
        continue;
      }
      entries_[static_cast<size_t>(e)].state = StageState::kWriting;
      batch.push_back(e);
    }
    // In slot order: a batch put into descending or scattered free slots (the free list's order after
    // releases) still goes out as runs of consecutive slots, one pwritev each. Each slot is in a batch at
    // most once (a newer put of a slot cancels the queued one).
    std::sort(batch.begin(), batch.end(), [&](int a, int b) {
      return entries_[static_cast<size_t>(a)].slot < entries_[static_cast<size_t>(b)].slot;
    });
    writing_ = batch.size();
    lock.unlock();
    write_batch(batch, written);
    lock.lock();
    for (size_t i = 0; i < batch.size(); ++i) {
      const Slot s = entries_[static_cast<size_t>(batch[i])].slot;
      const bool still_current = staged_entry_[static_cast<size_t>(s)] == batch[i];
      if (!written[i]) {
        ++io_.write_errors;
        if (still_current) {  // the put's record never reached the file: it is not stored after all
          index_.release(s);
          ++stats_.put_failures;
        }
      }
      if (still_current) staged_entry_[static_cast<size_t>(s)] = -1;
      release_entry(batch[i]);
    }
    writing_ = 0;
    progress_cv_.notify_all();
  }
}

// Outside the lock: the entries are in kWriting state, nobody else touches them or their buffers.
void FileColdTier::write_batch(std::span<const int> batch, std::vector<bool>& written) {
  written.assign(batch.size(), false);
  std::vector<iovec> iov;
  uint64_t calls = 0, bytes = 0;
  int first_error = 0;
  for (size_t begin = 0; begin < batch.size();) {
    const Slot first = entries_[static_cast<size_t>(batch[begin])].slot;
    size_t end = begin + 1;
    while (end < batch.size() && entries_[static_cast<size_t>(batch[end])].slot == first + static_cast<Slot>(end - begin)) {
      ++end;
    }
    iov.clear();
    for (size_t i = begin; i < end; ++i) iov.push_back({stage_buffer(batch[i]), slot_bytes_});
    const cold::TransferResult r = cold::write_fully(fd_.get(), iov, static_cast<int64_t>(first) * slot_bytes_);
    calls += r.calls;
    bytes += r.bytes;
    for (size_t i = begin; i < end && (i - begin + 1) * slot_bytes_ <= r.bytes; ++i) written[i] = true;
    if (r.error != 0 && first_error == 0) first_error = r.error;
    begin = end;
  }
  std::lock_guard lock(mu_);
  io_.write_calls += calls;
  io_.disk_bytes_written += bytes;
  if (first_error != 0 && !logged_bad_write_) {
    std::fprintf(stderr, "[kvpack] cold tier: write to %s failed: %s (records dropped)\n", path_.c_str(),
                 std::strerror(first_error));
    logged_bad_write_ = true;
  }
}

void FileColdTier::flush() {
  std::unique_lock lock(mu_);
  progress_cv_.wait(lock, [&] { return queue_.empty() && writing_ == 0; });
}

void FileColdTier::drop_page_cache() {
  flush();
  ::fdatasync(fd_.get());  // only clean pages can be dropped
  ::posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_DONTNEED);
}

struct FileColdTier::PendingRead {
  size_t index;       // into the caller's arrays
  Slot slot;
  uint32_t version;   // of the slot when the read was planned
  uint64_t key;
  enum Outcome : uint8_t { kHit, kCorrupt, kShort } outcome = kShort;
};

bool FileColdTier::get(uint64_t key, std::span<uint8_t> out) {
  if (out.size() != record_bytes_) throw std::invalid_argument("cold tier get: buffer of the wrong size");
  uint8_t* const buffers[1] = {out.data()};
  bool ok[1] = {false};
  get_many({&key, 1}, buffers, ok);
  return ok[0];
}

void FileColdTier::get_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok) {
  cold::check_batch(keys.size(), out.size(), ok.size(), "get_many");
  read_many(keys, out, ok, false);
}

void FileColdTier::take_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok) {
  cold::check_batch(keys.size(), out.size(), ok.size(), "take_many");
  read_many(keys, out, ok, true);
}

void FileColdTier::read_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok, bool take) {
  std::vector<PendingRead> reads;
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      ++stats_.gets;
      ok[i] = false;
      const Slot s = index_.find(keys[i]);
      if (s == kNoSlot) {
        ++stats_.misses;
      } else if (const int e = staged_entry_[static_cast<size_t>(s)]; e >= 0) {
        std::memcpy(out[i], stage_buffer(e) + sizeof(SlotHeader), record_bytes_);  // not in the file yet
        if (take) {
          forget(s);
        } else {
          index_.touch(s);
        }
        ok[i] = true;
        ++stats_.hits;
        ++io_.stage_hits;
        stats_.bytes_read += record_bytes_;
      } else {
        reads.push_back({i, s, version_[static_cast<size_t>(s)], keys[i]});
      }
    }
  }
  if (reads.empty()) return;
  std::sort(reads.begin(), reads.end(), [](const PendingRead& a, const PendingRead& b) { return a.slot < b.slot; });
  if (readahead_hint_ && !direct_reads() && reads.size() > 1) {
    for (size_t begin = 0; begin < reads.size();) {
      size_t end = begin + 1;
      while (end < reads.size() && reads[end].slot == reads[end - 1].slot + 1) ++end;
      ::posix_fadvise(fd_.get(), static_cast<off_t>(reads[begin].slot) * static_cast<off_t>(slot_bytes_),
                      static_cast<off_t>(end - begin) * static_cast<off_t>(slot_bytes_), POSIX_FADV_WILLNEED);
      begin = end;
    }
  }
  const size_t n = reads.size();
  // Direct reads: one task per read-sized piece, claimed in file order by whichever I/O thread is free,
  // so the device sees one sequential stream with a request per thread in flight (tasks spread over
  // distant parts of the file, four streams at once, read at ~60 % of one sequential stream here).
  // Buffered: parts of about 1 MiB, about four per thread.
  const size_t per_task = direct_reads() ? direct_piece_slots_ : std::max<size_t>(1, (size_t{1} << 20) / slot_bytes_);
  const int tasks = direct_reads() ? static_cast<int>((n + per_task - 1) / per_task) : tasks_for(n, per_task);
  const bool streaming = n * record_bytes_ >= cold::kStreamingCopyBytes;
  for_each_task_on_thread(tasks, [&](int task, int thread) {
    const size_t begin = n * static_cast<size_t>(task) / static_cast<size_t>(tasks);
    const size_t end = n * static_cast<size_t>(task + 1) / static_cast<size_t>(tasks);
    read_runs(std::span<PendingRead>(reads).subspan(begin, end - begin), out, thread, streaming);
  });

  std::lock_guard lock(mu_);
  // In descending slot order: release() puts a slot at the front of the free list, so the slots a take
  // frees are handed out again in ascending order, and the next batch of puts lands in one run.
  for (auto it = reads.rbegin(); it != reads.rend(); ++it) {
    const PendingRead& r = *it;
    const Slot now = index_.find(r.key);
    if (r.outcome == PendingRead::kHit) {
      if (take && now != kNoSlot) {
        forget(now);
      } else if (now == r.slot) {
        index_.touch(r.slot);
      }
      ok[r.index] = true;
      ++stats_.hits;
      stats_.bytes_read += record_bytes_;
      continue;
    }
    ++stats_.misses;
    const bool unchanged = now == r.slot && version_[static_cast<size_t>(r.slot)] == r.version;
    if (!unchanged) {  // the slot was reassigned while we read it: a race, not damage
      if (take && now != kNoSlot) forget(now);
      continue;
    }
    ++stats_.checksum_failures;
    log_once(r.outcome == PendingRead::kShort ? "short read" : "checksum mismatch", r.slot);
    index_.release(r.slot);
  }
}

// Outside the lock: cuts `reads` (sorted by slot) into runs of consecutive slots and reads each one,
// around the page cache unless it is all cached (see the header).
void FileColdTier::read_runs(std::span<PendingRead> reads, std::span<uint8_t* const> out, int thread, bool streaming) {
  constexpr size_t kRecordsPerCall = cold::kMaxIovecs / 2;  // a header and a record per slot
  std::vector<SlotHeader> headers;
  uint64_t calls = 0, direct_calls = 0, bytes = 0;
  for (size_t begin = 0; begin < reads.size();) {
    size_t end = begin + 1;
    while (end < reads.size() && end - begin < kRecordsPerCall &&
           reads[end].slot == reads[begin].slot + static_cast<Slot>(end - begin)) {
      ++end;
    }
    const std::span<PendingRead> run = reads.subspan(begin, end - begin);
    begin = end;
    if (direct_reads() && (direct_even_if_cached_ || !run_is_cached(run.front().slot, run.size()))) {
      auto& bounce = bounce_[static_cast<size_t>(thread)];
      if (!bounce) {
        bounce.reset(static_cast<uint8_t*>(std::aligned_alloc(kDirectAlign, align_up(direct_piece_slots_ * slot_bytes_) + kDirectAlign)));
      }
      uint64_t c = 0;
      if (bounce && read_run_direct(run, out, bounce.get(), streaming, c, bytes)) {
        calls += c;
        direct_calls += c;
        continue;
      }
      calls += c;  // refused (or no buffer): read it buffered below
    }
    if (headers.size() < run.size()) headers.resize(run.size());
    read_run_buffered(run, out, headers.data(), calls, bytes);
  }
  std::lock_guard lock(mu_);
  io_.read_calls += calls;
  io_.direct_read_calls += direct_calls;
  io_.disk_bytes_read += bytes;
}

void FileColdTier::read_run_buffered(std::span<PendingRead> run, std::span<uint8_t* const> out, SlotHeader* headers,
                                     uint64_t& calls, uint64_t& bytes) {
  std::vector<iovec> iov;
  iov.reserve(2 * run.size());
  for (size_t i = 0; i < run.size(); ++i) {
    iov.push_back({&headers[i], sizeof(SlotHeader)});
    iov.push_back({out[run[i].index], record_bytes_});
  }
  const cold::TransferResult t = cold::read_fully(fd_.get(), iov, static_cast<int64_t>(run.front().slot) * slot_bytes_);
  calls += t.calls;
  bytes += t.bytes;
  for (size_t i = 0; i < run.size(); ++i) {
    PendingRead& r = run[i];
    if ((i + 1) * slot_bytes_ > t.bytes) {
      r.outcome = PendingRead::kShort;  // truncated file or an I/O error
      continue;
    }
    const SlotHeader& h = headers[i];
    const bool valid = h.magic == kMagic && h.record_bytes == record_bytes_ && h.generation == generation_ &&
                       h.key == r.key &&
                       h.checksum == cold::record_checksum(r.key, {out[r.index], record_bytes_}, generation_);
    r.outcome = valid ? PendingRead::kHit : PendingRead::kCorrupt;
  }
}

bool FileColdTier::read_run_direct(std::span<PendingRead> run, std::span<uint8_t* const> out, uint8_t* bounce,
                                   bool streaming, uint64_t& calls, uint64_t& bytes) {
  const size_t per_piece = direct_piece_slots_;
  for (size_t begin = 0; begin < run.size(); begin += per_piece) {
    const size_t n = std::min(per_piece, run.size() - begin);
    const size_t first = static_cast<size_t>(run[begin].slot) * slot_bytes_;
    const size_t from = align_down(first);
    const size_t to = align_up(first + n * slot_bytes_);
    iovec iov{bounce, to - from};
    const cold::TransferResult t = cold::read_fully(direct_fd_.get(), {&iov, 1}, static_cast<int64_t>(from));
    calls += t.calls;
    if (t.error == EINVAL) {  // this file system does not do O_DIRECT after all: buffered from now on
      if (direct_ok_.exchange(false)) {
        std::fprintf(stderr, "[kvpack] cold tier: %s refuses O_DIRECT reads; reading through the page cache\n", path_.c_str());
      }
      if (begin == 0) return false;
      // Pieces already read keep their outcomes; the rest of the run is read buffered.
      std::vector<SlotHeader> headers(run.size() - begin);
      read_run_buffered(run.subspan(begin), out, headers.data(), calls, bytes);
      return true;
    }
    bytes += t.bytes;
    for (size_t i = 0; i < n; ++i) {
      PendingRead& r = run[begin + i];
      const size_t at = first + i * slot_bytes_ - from;  // the slot's offset in the bounce buffer
      if (at + slot_bytes_ > t.bytes) {
        r.outcome = PendingRead::kShort;  // truncated file or an I/O error
        continue;
      }
      SlotHeader h;
      std::memcpy(&h, bounce + at, sizeof h);
      if (h.magic != kMagic || h.record_bytes != record_bytes_ || h.generation != generation_ || h.key != r.key) {
        r.outcome = PendingRead::kCorrupt;
        continue;
      }
      const uint64_t sum = cold::copy_with_checksum(r.key, bounce + at + sizeof h, out[r.index], record_bytes_, generation_, streaming);
      r.outcome = sum == h.checksum ? PendingRead::kHit : PendingRead::kCorrupt;
    }
  }
  return true;
}

bool FileColdTier::run_is_cached(Slot first, size_t n) const {
  if (map_ == nullptr) return false;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t from = static_cast<size_t>(first) * slot_bytes_ / page * page;
  const size_t to = std::min(map_bytes_, static_cast<size_t>(first) * slot_bytes_ + n * slot_bytes_);
  unsigned char resident[256];
  for (size_t at = from; at < to;) {
    const size_t len = std::min(to - at, sizeof resident * page);
    if (::mincore(static_cast<uint8_t*>(map_) + at, len, resident) != 0) return false;
    const size_t pages = (len + page - 1) / page;
    for (size_t i = 0; i < pages; ++i)
      if (!(resident[i] & 1)) return false;
    at += len;
  }
  return true;
}

void FileColdTier::log_once(const char* what, Slot s) {
  if (logged_bad_read_) return;
  std::fprintf(stderr, "[kvpack] cold tier: %s in %s slot %d (record dropped)\n", what, path_.c_str(), s);
  logged_bad_read_ = true;
}

void FileColdTier::forget(Slot s) {
  supersede_staged(s);
  index_.release(s);
}

void FileColdTier::erase(uint64_t key) {
  std::lock_guard lock(mu_);
  if (const Slot s = index_.find(key); s != kNoSlot) forget(s);
}

FileTierIoStats FileColdTier::io_stats() const {
  std::lock_guard lock(mu_);
  return io_;
}

int64_t FileColdTier::slot_of(uint64_t key) const {
  std::lock_guard lock(mu_);
  return index_.find(key);
}

namespace {
constexpr size_t kProbeBlock = size_t{8} << 20;
}  // namespace

SequentialReadProbe::SequentialReadProbe(const std::string& dir, size_t bytes) : dir_(dir), bytes_(bytes) {
  std::string name = (std::filesystem::path(dir) / "kvpack-seqread-XXXXXX").string();
  fd_ = cold::UniqueFd(::mkostemp(name.data(), O_CLOEXEC));
  if (!fd_) throw path_error("cannot create a scratch file in", dir, errno);
  ::unlink(name.c_str());  // gone when fd closes, even if we are killed half-way
  auto block = std::make_unique_for_overwrite<uint8_t[]>(kProbeBlock);
  std::mt19937_64 rng(0x5eed);
  for (size_t i = 0; i + 8 <= kProbeBlock; i += 8) {  // incompressible: no file system or device shortcut
    const uint64_t v = rng();
    std::memcpy(block.get() + i, &v, 8);
  }
  for (size_t done = 0; done < bytes;) {
    iovec iov{block.get(), std::min(kProbeBlock, bytes - done)};
    const cold::TransferResult r = cold::write_fully(fd_.get(), {&iov, 1}, static_cast<int64_t>(done));
    if (r.error != 0) throw path_error("cannot write a scratch file in", dir, r.error);
    done += r.bytes;
  }
  ::fdatasync(fd_.get());  // dirty pages cannot be dropped; clean ones can
  const std::string proc_path = "/proc/self/fd/" + std::to_string(fd_.get());  // the unlinked file, reopened
  direct_fd_ = cold::UniqueFd(::open(proc_path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
}

SequentialReadMeasurement SequentialReadProbe::measure() const {
  ::posix_fadvise(fd_.get(), 0, static_cast<off_t>(bytes_), POSIX_FADV_DONTNEED);
  SequentialReadMeasurement m;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (void* map = ::mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd_.get(), 0); map != MAP_FAILED) {
    std::vector<unsigned char> resident((bytes_ + page - 1) / page);
    if (::mincore(map, bytes_, resident.data()) == 0) {
      const size_t n = static_cast<size_t>(std::count_if(resident.begin(), resident.end(), [](unsigned char c) { return c & 1; }));
      m.resident_fraction = static_cast<double>(n) / static_cast<double>(resident.size());
    }
    ::munmap(map, bytes_);
  }
  ::posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<uint8_t, FreeBuffer> buf(static_cast<uint8_t*>(std::aligned_alloc(kDirectAlign, kProbeBlock)));
  if (!buf) throw std::bad_alloc();
  const auto timed_read = [&](int read_fd) {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t done = 0; done < bytes_;) {
      // A direct read asks for whole blocks; the file may end inside the last one (a short read there).
      iovec iov{buf.get(), std::min(kProbeBlock, align_up(bytes_ - done))};
      const cold::TransferResult r = cold::read_fully(read_fd, {&iov, 1}, static_cast<int64_t>(done));
      if (r.error == EINVAL && read_fd != fd_.get()) return 0.0;  // no O_DIRECT here after all
      if (r.error != 0 || r.bytes == 0) throw path_error("cannot read back a scratch file in", dir_, r.error ? r.error : EIO);
      done += std::min(r.bytes, bytes_ - done);
    }
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    return static_cast<double>(bytes_) / std::max(dt.count(), 1e-9) / 1e9;
  };
  m.buffered_gbps = timed_read(fd_.get());
  if (direct_fd_) {
    ::posix_fadvise(fd_.get(), 0, static_cast<off_t>(bytes_), POSIX_FADV_DONTNEED);
    m.direct_gbps = timed_read(direct_fd_.get());
  }
  m.gbps = std::max(m.buffered_gbps, m.direct_gbps);
  return m;
}

SequentialReadMeasurement measure_sequential_read(const std::string& dir, size_t bytes) {
  return SequentialReadProbe(dir, bytes).measure();
}

double measure_sequential_read_gbps(const std::string& dir, size_t bytes) { return measure_sequential_read(dir, bytes).gbps; }

}  // namespace kvpack::kv
