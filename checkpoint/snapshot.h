// checkpoint/snapshot.h — snapshots of a training run: what is in one, how it is written
// and read, and how a run continues from one (exactly, or with another parallel layout).
//
// A snapshot is a directory `step-<k>` inside checkpoint.dir holding
//   shard-dp<d>-pp<s>-tp<t>.bin  one per worker: the pieces of its state (below), each
//                                with a crc32;
//   manifest.capnp               written last and atomically (temporary file, fsync,
//                                rename, fsync of the directory): step, config, layout,
//                                every logical tensor's shape and TP sharding, loss-scaler
//                                state, AdamW update count, tokenizer hash, versions, and
//                                each shard file's size and crc32 (schemas/snapshot.capnp).
// A directory without a valid manifest is never taken for a snapshot.
//
// State pieces: elements [offset, offset + n) of one field (value, fp32 master, AdamW m,
// AdamW v) of one worker's local (TP-shard) tensor. Values come from DP rank 0 (replicas are
// bitwise equal); the optimizer fields from whichever DP rank owns them (ZeRO-1 shards them).
// The tied embedding is written once, by the first stage (its two copies are bitwise equal).
// Loading reassembles every logical (unsharded) tensor, so any layout can continue from it;
// the loader, the dropout masks and the learning rate are stateless functions of the step
// and the seed, so nothing else is needed to continue exactly.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/tensor.h"

namespace troupe {

// A snapshot that is intact but belongs to another run (a model, data or optimizer key
// differs): `latest` does not fall back past it, the user must fix the config.
struct SnapshotMismatch : UserError {
  using UserError::UserError;
};

enum class StateField : uint8_t { value = 0, master = 1, adam_m = 2, adam_v = 3 };

struct ShardRecord {
  std::string name;     // logical tensor name (gpt_param_specs)
  StateField field = StateField::value;
  int32_t tp = 0;       // TP rank whose local tensor this is a piece of
  int64_t offset = 0;   // first element within the local tensor
  int64_t local_numel = 0;  // elements of the whole local tensor
  std::vector<float> data;
};

// One worker's state at a step, copied to host memory (the training step waits only for
// this copy; the writer takes it from there).
struct ShardData {
  int dp = 0, pp = 0, tp = 0;
  std::vector<ShardRecord> records;
};

struct LogicalTensor {
  Tensor value, master, m, v;  // master: mixed precision only; m/v: absent before the first update
};

// Everything a run continues from, besides its config.
struct TrainState {
  int64_t step = 0;         // the last completed step
  int64_t updates = 0;      // AdamW updates applied (its t)
  double loss_scale = 1.0;  // fp16 dynamic loss scaler
  int growth_tracker = 0;
  int hysteresis_tracker = 0;
  std::map<std::string, LogicalTensor> tensors;
  std::string dir;          // where it was loaded from
  std::string tokenizer_hash;  // of the run that saved it ("" if none recorded)
  std::string tokenizer_model;  // the bytes of its tokenizer.model, checked against the manifest ("" if not listed)
};

// What the manifest records besides the files (filled by the coordinator).
struct ManifestInfo {
  int64_t step = 0, updates = 0;
  double loss_scale = 1.0;
  int growth_tracker = 0, hysteresis_tracker = 0;
  std::string config_toml;
  int tp = 1, pp = 1, dp = 1, chunks = 1;
  std::string precision = "fp32";
  std::string tokenizer_hash;
  std::string tokenizer_path;  // copied into the snapshot as tokenizer.model (not in the manifest)
};

struct FileEntry {
  std::string name;
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

// "step-00000042"
std::string snapshot_name(int64_t step);
// "shard-dp0-pp1-tp0.bin"
std::string shard_file_name(int dp, int pp, int tp);

// Copies the tokenizer model into dir as tokenizer.model (fsynced), so a snapshot is
// usable without the corpus (troupe generate). Errors: Error naming the path.
FileEntry write_tokenizer_copy(const std::string& dir, const std::string& tokenizer_path);

// Writes one worker's shard file into dir (fsynced). Returns its name, size and crc32.
// Errors: Error naming the path (cannot create/write: disk full, permissions).
FileEntry write_shard_file(const std::string& dir, const ShardData& s);

// Writes dir/manifest.capnp atomically (temporary file, fsync, rename, fsync of dir).
// From then on dir is a complete snapshot. Errors: Error naming the path.
void write_manifest(const std::string& dir, const ManifestInfo& info, const std::vector<FileEntry>& files);

// Makes the snapshot written (manifest included) in tmp_dir the complete snapshot
// final_dir: an existing snapshot there (or a half-deleted one: snapshot files only) is
// removed first (its manifest before anything else), then tmp_dir is renamed and the parent
// directory fsynced. A folder there that is no snapshot and holds anything else (a user's
// files) is renamed to <final_dir>.kept (.2, ...), never deleted: returns that path ("" when
// none). Errors: Error naming the path. A failed fsync of the parent directory after the
// rename leaves final_dir a complete snapshot (as every later look at the folder sees it,
// unless the machine loses power first): with `unsynced` given, it receives that error
// (e.g. "cannot fsync directory D: Input/output error") and nothing is thrown; without it,
// it is thrown.
std::string commit_snapshot(const std::string& tmp_dir, const std::string& final_dir,
                            std::string* unsynced = nullptr);

// Throws UserError naming dir, the reason (Permission denied, ...) and the fix when this
// process cannot list and enter the folder `dir` (access(2) R_OK | X_OK): a folder it cannot
// read is not called incomplete. Does nothing for a readable folder, or for a path that is no
// folder (a file: the callers name it "not a directory").
void check_snapshot_readable(const std::string& dir);

// Throws UserError "snapshot DIR was removed while it was being read (a running troupe run's
// checkpoint.keep_last retention?) ..." when `dir` is gone, or (wait_s > 0) goes within
// wait_s seconds, polled every 50 ms: retention deletes a snapshot's manifest, then its
// files, then the folder, so a reader that finds a file missing, the manifest missing or the
// folder empty may be watching that deletion rather than an interrupted save. Returns when
// the folder stays.
void refuse_if_snapshot_removed(const std::string& dir, double wait_s = 0);

// Whether the folder `dir` ("…/step-00000004", also with a trailing '/') is named as a
// snapshot folder (step-…): one a run's retention may be deleting. Pure; never throws.
bool named_like_snapshot(const std::string& dir);

// The bytes of dir/manifest.capnp's Cap'n Proto message, after checking the file's trailer
// ("TRPMANI1" + crc32 of the message). Throws UserError naming the file (missing, damaged,
// unreadable).
std::vector<char> read_manifest(const std::string& dir);

// Reads and checks a snapshot for the run configured by cfg: the manifest parses; the
// model, data and precision keys equal cfg's (parallel.*, train.steps, checkpoint.*,
// logging and run options may differ); every shard file exists, has the recorded size and
// crc32, parses, and every piece's crc32 holds; every logical tensor is complete.
// Throws UserError naming the file or key and the fix.
TrainState load_snapshot(const std::string& dir, const Config& cfg);

// Loads the newest complete snapshot in ckpt_dir that loads for cfg (falling back past
// damaged ones, each reported through `skipped` as "<dir>: <why>"; once one loads, each
// skipped newer one is renamed to <dir>.unreadable so that no later snapshot or retention of
// the continuing run replaces or deletes it, and its report says so). Throws UserError when
// there is none.
TrainState load_latest(const std::string& ckpt_dir, const Config& cfg, std::vector<std::string>* skipped);

// The counters of a snapshot held in memory (checkpoint.memory_interval,
// checkpoint/memory_store.h): what its manifest would record besides the files.
struct MemoryInfo {
  int64_t step = 0, updates = 0;
  double loss_scale = 1.0;
  int growth_tracker = 0, hysteresis_tracker = 0;
};
// The TrainState of step info.step rebuilt from every worker's ShardData of that step (one
// per (dp, pp, tp) of a layout with cfg.parallel.tp; any order), as load_snapshot rebuilds
// it from files: pieces are placed by (name, field, TP rank, offset) and every logical
// tensor must be covered exactly once. `label` names the source in errors and becomes
// TrainState::dir. Throws Error naming the tensor when a piece is missing, doubled or out
// of range.
TrainState assemble_state(const MemoryInfo& info, const std::vector<std::shared_ptr<const ShardData>>& shards,
                          const Config& cfg, const std::string& label);
// Complete snapshots in ckpt_dir, oldest first (by step); none when ckpt_dir is no folder.
// Throws UserError naming the folder and the cause when listing it fails (EIO, EACCES).
std::vector<std::pair<int64_t, std::string>> list_snapshots(const std::string& ckpt_dir);

// Deletes complete snapshots older than the newest `keep_last` ones (keep_last >= 1: the
// newest complete one always stays). Directories without a manifest (in progress or left
// by a crash) are not touched, nor is a snapshot that is a symbolic link (it lives
// elsewhere). Returns the directories actually deleted (a read-only one stays and is not
// counted). written_step > 0: the snapshot just written; snapshots of later steps (another
// line, left by a run this one resumed before, that set_aside_later_steps could not move)
// are never deleted.
// not_deleted (when given) receives each snapshot that should have gone but stays, with the
// reason (the error of its removal: permissions, an immutable attribute, a busy mount).
std::vector<std::string> apply_retention(const std::string& ckpt_dir, int keep_last, int64_t written_step = 0,
                                         std::vector<std::pair<std::string, std::string>>* not_deleted = nullptr);

// After this run wrote the snapshot of step written_step: every complete snapshot in ckpt_dir
// of a later step belongs to the line this run left when it resumed an earlier snapshot (its
// steps will be trained again, differently), so it is renamed to <dir>.superseded (.2, ...
// when taken). --resume latest, retention, restarts and the "newest snapshot" of every
// message then mean this run's own line, as Megatron-LM's latest_checkpointed_iteration.txt
// names the last one written; nothing is deleted, and `--resume <dir>.superseded` still
// loads it. Returns each (snapshot, new path), the new path "" where the rename failed (a
// read-only folder: it stays, and latest would still take it).
std::vector<std::pair<std::string, std::string>> set_aside_later_steps(const std::string& ckpt_dir,
                                                                        int64_t written_step);

// Config keys allowed to differ between a snapshot and the run that resumes from it: parallel.*
// (re-sharded on load), checkpoint.*, fault.*, cluster.* (troupe plan's only) and the run
// options train.steps, train.eval_interval, train.eval_batches, train.threads,
// train.sample_tokens, train.timeout_s, train.tensorboard_dir, data.cache_dir, data.threads
// and data.lock_timeout_s (none changes the math; README "Keys that may differ on resume").
bool resume_may_differ(const std::string& key);

}  // namespace troupe
