// datasets/pipeline.cpp — see pipeline.h.
#include "datasets/pipeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_set>

#include "core/error.h"

#include "datasets/cache_folder.h"
#include "datasets/minhash.h"
#include "datasets/sources.h"
#include "datasets/token_file.h"
#include "datasets/tokenizer.h"

namespace troupe {

namespace {
// The fix of a failed write of a scratch or output file: the file-size limit (ulimit -f) when
// that is the cause, else the disk.
const char* write_fix(int err) { return err == EFBIG ? path_error_fix(err) : "check free disk space"; }


double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  return buf;
}

// The first `max` bytes of `text`, cut at a character boundary.
std::string clip(const std::string& text, size_t max) {
  if (text.size() <= max) return text;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return text.substr(0, n);
}

// Scratch file of cleaned documents: records of u64 length + bytes.
class ScratchWriter {
 public:
  explicit ScratchWriter(const std::string& path) : path_(path) {
    // (not through a symbolic link: that would overwrite the file it points to)
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    int err = errno;
    TROUPE_USER_CHECK(fd >= 0 || err != ELOOP) << link_in_cache(path);
    if (fd >= 0 && !(f_ = ::fdopen(fd, "wb"))) err = errno, ::close(fd);
    TROUPE_USER_CHECK(f_ != nullptr) << "cannot create '" << path << "': " << std::strerror(err) << "; "
                                     << path_error_fix(err) << " (data.cache_dir)";
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
  }
  ~ScratchWriter() {
    if (f_) std::fclose(f_);
  }
  void add(const std::string& text) {
    const uint64_t n = text.size();
    ok_ = ok_ && std::fwrite(&n, 8, 1, f_) == 1 && std::fwrite(text.data(), 1, n, f_) == n;
    TROUPE_USER_CHECK(ok_) << "cannot write '" << path_ << "': " << std::strerror(errno) << "; " << write_fix(errno);
  }
  void close() {
    const bool ok = std::fclose(f_) == 0;
    f_ = nullptr;
    TROUPE_USER_CHECK(ok) << "cannot write '" << path_ << "': " << std::strerror(errno) << "; " << write_fix(errno);
  }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  bool ok_ = true;
};

class ScratchReader {
 public:
  explicit ScratchReader(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "rb")) {
    TROUPE_CHECK(f_ != nullptr) << "cannot open the scratch file " << path;
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
  }
  ~ScratchReader() { std::fclose(f_); }
  bool next(std::string& text) {
    uint64_t n = 0;
    if (std::fread(&n, 8, 1, f_) != 1) return false;
    text.resize(n);
    TROUPE_CHECK(std::fread(text.data(), 1, n, f_) == n) << "scratch file " << path_ << " is truncated";
    return true;
  }

 private:
  std::string path_;
  std::FILE* f_;
};

// The pure per-document results of pass 1.
struct DocWork {
  RawDoc raw;
  bool normalized = false;
  uint64_t hash = 0;
  int failed_filter = -1;
  MinHashSig sig{};
};

}  // namespace

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
}

void parallel_for(size_t n, int threads, const std::function<void(size_t)>& fn) {
  const size_t nt = std::min<size_t>(static_cast<size_t>(std::max(1, threads)), std::max<size_t>(n, 1));
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex m;
  auto work = [&] {
    try {
      for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(m);
      if (!error) error = std::current_exception();
      next.store(n);
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < nt; ++t) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {  // no thread left (ulimit -u, a cgroup's pids.max): the
      break;                              // started ones share the work, by index: the same result
    }
  }
  work();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

Progress::Progress(std::string phase, uint64_t total_bytes, DataLogFn log)
    : phase_(std::move(phase)), total_(std::max<uint64_t>(total_bytes, 1)), log_(std::move(log)),
      tty_(::isatty(STDERR_FILENO) != 0 && std::getenv("TROUPE_NO_PROGRESS_BAR") == nullptr), t0_(now_s()) {}

Progress::~Progress() {
  if (tty_ && !finished_) std::fputs("\n", stderr);
}

void Progress::update(uint64_t done) {
  const double t = now_s();
  const double rate = static_cast<double>(done) / std::max(1e-9, t - t0_);
  const double frac = std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
  if (tty_) {
    if (t - last_ < 0.2) return;
    last_ = t;
    const int width = 30, fill = static_cast<int>(frac * width);
    const double eta = rate > 0 ? static_cast<double>(total_ - std::min(done, total_)) / rate : 0;
    std::fprintf(stderr, "\r%s [%.*s%*s] %3.0f%% %s/s ETA %d:%02d   ", phase_.c_str(), fill,
                 "##############################", width - fill, "", frac * 100, human_bytes(rate).c_str(),
                 static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
    std::fflush(stderr);
  } else if (log_ && static_cast<int>(frac * 10) >= next_decile_) {
    next_decile_ = static_cast<int>(frac * 10) + 1;
    log_(phase_ + ": " + std::to_string(static_cast<int>(frac * 10) * 10) + "% (" + human_bytes(static_cast<double>(done)) +
         " of " + human_bytes(static_cast<double>(total_)) + ", " + human_bytes(rate) + "/s)");
  }
}

void Progress::finish(uint64_t done) {
  if (tty_ && !finished_) std::fputs("\r\033[K", stderr);
  finished_ = true;
  const double s = now_s() - t0_;
  if (log_) {
    char line[200];
    std::snprintf(line, sizeof line, "%s: done, %s in %.1f s (%s/s)", phase_.c_str(),
                  human_bytes(static_cast<double>(done)).c_str(), s, human_bytes(static_cast<double>(done) / std::max(s, 1e-9)).c_str());
    log_(line);
  }
}

CleanOutput clean_source(const DataSource& source, const std::string& scratch_path, int threads, double sample_rate,
                         const DataLogFn& log) {
  auto reader = DocReader::open(source);
  TROUPE_USER_CHECK(reader->bytes_total() > 0)
      << "source '" << source.name << "': '" << source.path << "' is empty; it must hold "
      << (source.format == "jsonl" ? "one JSON object per line" : "UTF-8 text")
      << (source.path.rfind("/proc/", 0) == 0 || source.path.rfind("/sys/", 0) == 0
              ? " (files under /proc and /sys report no size: copy it to a regular file first)"
              : " (fetch it again or fix its path)");
  CleanOutput out;
  SourceReport& rep = out.report;
  rep.name = source.name;
  Progress progress("cleaning " + source.name, reader->bytes_total(), log);
  ScratchWriter scratch(scratch_path);
  std::unordered_set<uint64_t> seen;
  LshIndex lsh;
  const auto sample_cut = static_cast<uint64_t>(std::min(1.0, sample_rate) * 18446744073709551615.0);
  std::vector<int> removed_per_reason(kNumQualityFilters + 2, 0);
  auto keep_removed = [&](int reason_id, const std::string& reason, const RawDoc& d) {
    if (removed_per_reason[reason_id]++ < 3) out.removed.push_back({source.name, reason, d.file, d.line, clip(d.text, 1000)});
  };

  std::vector<DocWork> batch;
  for (bool more = true; more;) {
    batch.clear();
    uint64_t bytes = 0;
    while (bytes < kBatchBytes) {
      batch.emplace_back();
      if (!reader->next(batch.back().raw)) {
        batch.pop_back();
        more = false;
        break;
      }
      bytes += batch.back().raw.text.size();
    }
    parallel_for(batch.size(), threads, [&](size_t i) {
      DocWork& w = batch[i];
      if (source.normalize) w.normalized = normalize_nfc(w.raw.text);
      w.hash = doc_hash(w.raw.text);
      if (source.quality) w.failed_filter = quality_check(w.raw.text);
      if (source.near_dedup) w.sig = minhash_signature(w.raw.text);
    });
    for (DocWork& w : batch) {  // in document order
      ++rep.docs_in;
      rep.bytes_in += w.raw.text.size();
      rep.normalized += w.normalized;
      if (source.dedup && !seen.insert(w.hash).second) {
        ++rep.exact_duplicates;
        keep_removed(0, "exact_duplicate", w.raw);
        continue;
      }
      if (w.failed_filter >= 0) {
        ++rep.filtered[static_cast<size_t>(w.failed_filter)];
        keep_removed(2 + w.failed_filter, kQualityFilters[w.failed_filter], w.raw);
        continue;
      }
      if (source.near_dedup && lsh.check_and_add(w.sig, source.near_threshold)) {
        ++rep.near_duplicates;
        keep_removed(1, "near_duplicate", w.raw);
        continue;
      }
      if ((w.hash ^ (w.hash >> 31)) * 0x9e3779b97f4a7c15ull <= sample_cut) out.sample.push_back({rep.docs_kept, w.raw.text});
      scratch.add(w.raw.text);
      ++rep.docs_kept;
      rep.bytes_kept += w.raw.text.size();
    }
    progress.update(reader->bytes_read());
  }
  scratch.close();
  rep.invalid_utf8_bytes = reader->invalid_bytes();
  progress.finish(reader->bytes_read());
  TROUPE_USER_CHECK(rep.docs_in > 0) << "source '" << source.name << "': '" << source.path
                                     << "' holds no document (only blank lines); fix the file or its path";
  return out;
}

void tokenize_scratch(const Tokenizer& tok, const std::string& scratch_path, uint64_t n_train, TokenFileWriter& train,
                      TokenFileWriter& val, int threads, const std::string& name, const DataLogFn& log) {
  ScratchReader in(scratch_path);
  Progress progress("tokenizing " + name, std::filesystem::file_size(scratch_path), log);
  std::vector<std::string> docs;
  std::vector<std::vector<int32_t>> ids;
  uint64_t index = 0, done = 0;
  for (bool more = true; more;) {
    docs.clear();
    uint64_t bytes = 0;
    std::string text;
    while (bytes < kBatchBytes) {
      if (!in.next(text)) {
        more = false;
        break;
      }
      bytes += text.size() + 8;
      docs.push_back(std::move(text));
    }
    ids.resize(docs.size());
    parallel_for(docs.size(), threads, [&](size_t i) {
      ids[i] = tok.encode(docs[i]);
      ids[i].push_back(tok.eot_id());
    });
    for (size_t i = 0; i < docs.size(); ++i, ++index) (index < n_train ? train : val).add_document(ids[i]);
    done += bytes;
    progress.update(done);
  }
  progress.finish(done);
}

}  // namespace troupe
