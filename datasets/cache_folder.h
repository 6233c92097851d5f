// datasets/cache_folder.h — a data cache folder <data.cache_dir>/<key>-v<V>/ around one
// preparation (datasets/prepare.cpp): made, locked, and removed again when the preparation is
// stopped or fails, with the folders above it that were made for it.
//
// Several processes may prepare one folder at once (the processes of a job, or two runs
// sharing a cache): each makes the folders that are missing, then one holds the lock and
// builds while the others wait. Which one made the folders above the cache folder is a race,
// so each process that made some records the outermost in <folder>/.made (one line each,
// appended). The process that builds, when stopped or failing, removes the cache folder and
// then each recorded folder that is empty; a process stopped while waiting removes the
// folders it made itself when they are empty (a folder in use is not empty: it holds .lock).
// A folder that existed before the run is never removed. The commit drops .made.
#pragma once
#include <string>

#include "core/error.h"
#include "datasets/corpus.h"

namespace troupe {

// The files a preparation writes in its cache folder, the one list of them: those of the
// folder (meta.json last, the commit), and per source <name><suffix>. A rebuild or a stopped
// preparation removes these names (and their temporaries) only; anything else stays.
namespace cache_files {
inline constexpr const char* kMeta = "meta.json";
inline constexpr const char* kTokenizer = "tokenizer.model";
inline constexpr const char* kReport = "report.json";
inline constexpr const char* kRemoved = "removed.jsonl";
inline constexpr const char* kFolderFiles[] = {kMeta, kTokenizer, kReport, kRemoved};
inline constexpr const char* kTrainBin = ".train.bin";
inline constexpr const char* kValBin = ".val.bin";
inline constexpr const char* kTrainIdx = ".train.idx";
inline constexpr const char* kValIdx = ".val.idx";
inline constexpr const char* kScratch = ".scratch";  // pass 1's cleaned text, gone at the commit
inline constexpr const char* kSourceSuffixes[] = {kTrainBin, kValBin, kTrainIdx, kValIdx, kScratch};
}  // namespace cache_files

// Whether `dir` is a prepared data cache folder: meta.json beside tokenizer.model or the token
// files corpus.train.bin/.idx (what prepare writes, datasets/prepare.h). Never throws (an
// unreadable folder is none).
bool is_prepared_cache(const std::string& dir);

// The prepared data cache that `path` is or lies inside (the nearest folder, `path` included,
// for which is_prepared_cache holds), "" when none. `path` should be absolute (resolved_path).
// Never throws.
std::string prepared_cache_around(const std::string& path);

// The refusal of a symbolic link at `path`, a file troupe writes in a data cache folder (its
// .lock, a scratch file): "'PATH' is a symbolic link (to 'T'): ... remove it (rm 'PATH') and
// run again (data.cache_dir)". Writing through it would change the file it points to.
std::string link_in_cache(const std::string& path);

// Makes `dir` and the folders above it that are missing. Returns the outermost one it made
// (absolute; "" when `dir` existed) and records it in <dir>/.made. Throws UserError naming
// data.cache_dir when `dir` cannot be made.
std::string make_cache_folder(const std::string& dir);

// What CacheLock throws when `dir` was removed while this process waited for its lock: the
// process preparing it ended without finishing it (stopped, refused or failed).
class CacheFolderRemoved : public UserError {
 public:
  using UserError::UserError;
};

// Holds an exclusive flock on <dir>/.lock for its lifetime, and removes the file as it lets
// go (no litter). A waiter that then holds a lock on the removed file opens the new one. A
// folder removed while this process waited (the preparation it waited for was stopped) is a
// CacheFolderRemoved that says so.
class CacheLock {
 public:
  // Waits at most timeout_s seconds for another holder (UserError after it, naming the
  // holder and data.lock_timeout_s).
  CacheLock(const std::string& dir, const DataLogFn& log, double timeout_s = 86400);
  ~CacheLock();
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// Uncommits the folder and removes what an interrupted or outdated preparation left (this
// process holds the folder's lock), naming it: only the file names a preparation writes
// (meta.json, tokenizer.model, report.json, removed.jsonl, <source>.{train,val}.{bin,idx},
// <source>.scratch and their .tmp files). .lock, .made and anything else stay (named in the log).
void remove_litter(const std::string& dir, const DataLogFn& log);

// After a stop signal or a failure during a build (this process holds the lock): removes
// `dir` while the preparing thread may still be writing into it, then each folder above it
// recorded in .made (and `made_here`) that is empty. `dir` is renamed away first, so that the
// thread cannot create a file in it any more (its paths under the old name fail), and then
// removed; files it still holds open go with it. A rename that fails falls back to removing
// in place. A folder that also holds files a preparation never writes (remove_litter's list)
// keeps them: only the preparation's files go, and the folder stays. Returns whether nothing
// of `dir` is left (in that case: nothing of the preparation's).
bool remove_stopped(const std::string& dir, const std::string& made_here);

// A process that did not build (stopped while waiting, or failing before it built): removes
// `dir` and the folders above it up to `made_here` (what make_cache_folder made here), each
// only when empty. Nothing when `made_here` is "".
void remove_made_if_empty(const std::string& dir, const std::string& made_here);

// The commit: the folders are the cache's now (.made goes).
void forget_made(const std::string& dir);

}  // namespace troupe
