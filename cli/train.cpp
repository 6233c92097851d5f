// cli/train.cpp — troupe train: checks everything a run needs before writing anything, then
// runs the job (recovering in place after a lost process under fault.policy = restart).
#include <exception>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <cctype>
#include <sys/resource.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "actors/cluster.h"
#include "actors/job.h"
#include "checkpoint/disk.h"
#include "checkpoint/export.h"
#include "checkpoint/snapshot.h"
#include "core/paths.h"
#include "core/launch_env.h"
#include "cli/figures.h"
#include "cli/launch.h"
#include "core/config.h"
#include "core/error.h"
#include "kernels/gemm_libs.h"
#include "core/events.h"
#include "core/tensorboard.h"
#include "datasets/corpus.h"
#include "datasets/loader.h"
#include "datasets/prepare.h"
#include "datasets/tokenizer.h"
#include "model/gpt.h"
#include "stages/schedule.h"
#include "stages/simulator.h"
#include "stages/stage.h"
#include <algorithm>
#include <cstring>
#include <iterator>
#include "cli/common.h"
#include "cli/train_checks.h"
#include "cli/train_report.h"
#include "cli/train_signals.h"
#include "core/interrupt.h"
#include "core/job_error.h"
#include "core/stop_notice.h"
#include "core/text.h"

extern char** environ;

namespace fs = std::filesystem;

namespace troupe::cli {
namespace {
// A failure after which a job must not be started again (fault.max_restarts exceeded).
struct FinalError : Error {
  using Error::Error;
};

// Token files, tokenizer and snapshot agree with the model (UserError naming the fix otherwise).
void check_data(const Config& c, const PreparedData& d, const BlendLoader& loader, const Tokenizer& tok,
                const TrainState* state) {
  // Token files are checked against the model before anything trains.
  for (size_t s = 0; s < loader.size(); ++s) {
    const auto& src = loader.source(s);
    for (const TokenFile* f : {src.train.get(), src.val.get()}) {
      f->check_tokenizer(d.tokenizer_hash);
      f->validate(c.model.vocab_size);
    }
    TROUPE_USER_CHECK(src.train->size() >= (uint64_t)c.train.seq_len + 1)
        << "the train split has " << src.train->size() << " tokens in source '" << src.name << "', fewer than train.seq_len + 1 = "
        << c.train.seq_len + 1 << "; use a bigger corpus or a smaller train.seq_len";
    TROUPE_USER_CHECK(src.val->size() >= (uint64_t)c.train.seq_len + 1)
        << "the validation split has " << src.val->size() << " tokens in source '" << src.name
        << "', fewer than train.seq_len + 1 = " << c.train.seq_len + 1
        << "; raise data.val_fraction or lower train.seq_len";
  }
  if (state && !state->tokenizer_hash.empty()) {
    TROUPE_USER_CHECK(state->tokenizer_hash == std::to_string(d.tokenizer_hash))
        << "snapshot " << state->dir << " was trained with another tokenizer (hash " << state->tokenizer_hash
        << ", the data now gives " << d.tokenizer_hash << "); resume with the same corpus and data.tokenizer";
  }
  TROUPE_USER_CHECK(tok.vocab_size() == c.model.vocab_size)
      << "the tokenizer " << d.tokenizer_path << " has " << tok.vocab_size() << " tokens but model.vocab_size = "
      << c.model.vocab_size << "; set model.vocab_size = " << tok.vocab_size() << " or use a matching data.tokenizer";
}

// Folders this run made (add() once it holds them: created, and locked where they have a
// lock); when the scope is left by an exception before `metrics` holds a record (no step
// was trained), those that hold no snapshot are removed again, newest first.
class FreshFolders {
 public:
  // `run_dir`: the run directory (read when the scope is left: its name may still change)
  explicit FreshFolders(const std::string& run_dir) : run_dir_(run_dir) {}
  // A folder the caller has just created ("" = none).
  void made(const std::string& dir) {
    if (!dir.empty()) dirs_.push_back(dir);
  }
  // Call before creating `dir`: records the outermost of its folders that does not exist
  // yet (a --run-dir a/b/c made a, b and c), nothing when `dir` exists.
  void will_create(const std::string& dir) {
    std::error_code ec;
    fs::path q = fs::absolute(dir, ec), first_new;
    // (symlink_status: a dangling link on the path exists and is the user's, never removed)
    for (; !q.empty() && !fs::exists(fs::symlink_status(q, ec)) && q != q.parent_path(); q = q.parent_path()) first_new = q;
    if (!first_new.empty()) dirs_.push_back(first_new.string());
  }
  ~FreshFolders() {
    if (std::uncaught_exceptions() == 0 || dirs_.empty()) return;
    try {
      std::error_code ec;
      const std::string metrics = run_dir_ + "/metrics.jsonl";
      if (fs::exists(metrics, ec) && fs::file_size(metrics, ec) > 0) return;  // a step was trained: keep it all
      for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it)
        if (list_snapshots(*it).empty()) fs::remove_all(*it, ec);
    } catch (...) {  // leaving litter is better than terminating during unwinding
    }
  }
  FreshFolders(const FreshFolders&) = delete;
  FreshFolders& operator=(const FreshFolders&) = delete;

 private:
  std::vector<std::string> dirs_;
  const std::string& run_dir_;
};

// "The newest snapshot on disk is DIR (step K); continue with --resume latest once the cause
// is fixed", or that none is there (or known to this process: "" for ckpt_dir).
std::string newest_snapshot_sentence(const std::string& ckpt_dir) {
  if (ckpt_dir.empty()) return "Continue from process 0's newest snapshot with --resume latest once the cause is fixed";
  const auto snaps = list_snapshots(ckpt_dir);
  if (snaps.empty()) return "No snapshot is on disk";
  return fmt::format("The newest snapshot on disk is {} (step {}); continue with --resume latest once the cause is fixed",
                     snaps.back().second, snaps.back().first);
}

// Runs the job; a process that survives a lost peer (in_place) joins the others again and
// continues, up to fault.max_restarts. Returns 0 with r filled, or 75 (start the job again)
// under fault.policy = restart with the whole-job respawn. Throws on any other failure.
int run_with_recovery(const Config& c, JobContext& ctx, const LaunchEnv& launch, bool in_place, int restart,
                      const std::string& ckpt_dir, JobResult& r) {
  for (int generation = restart;;) {
    try {
      r = run_job(c, ctx);
      break;
    } catch (const UserError&) {
      throw;
    } catch (const std::bad_alloc&) {  // a memory limit: starting again would meet it again
      throw;
    } catch (const FreshProcessError& e) {  // this process cannot go on; a new one can
      if (file_log_) file_log_->error("error: {}", e.what());
      if (launch.world > 1 && c.fault.policy == "restart") {
        // a warning, not the job's error line (core/job_error.h): the job goes on, and a
        // later final error of any process must still reach the screen
        spdlog::warn("{} (fault.policy = restart: this process exits with status 75, which asks troupe launch to "
                     "start it again)",
                     e.what());
        return 75;
      }
      if (launch.world > 1) throw FinalError(fmt::format("{}. {}", e.what(), newest_snapshot_sentence(ckpt_dir)));
      throw;
    } catch (const std::exception& e) {
      if (file_log_) file_log_->error("error: {}", e.what());  // the failure is in train.log too
      if (in_place) {  // this process survived: it joins the others again and continues
        ++generation;
        if (generation > c.fault.max_restarts)
          throw FinalError(fmt::format("{}; the job failed {} time(s), more than fault.max_restarts = {}: stopping for "
                                       "good. {}",
                                       e.what(), generation, c.fault.max_restarts, newest_snapshot_sentence(ckpt_dir)));
        spdlog::warn("{}\n(fault.policy = restart: recovering in place, restart {} of at most {}; waiting for every "
                     "process to join again)",
                     e.what(), generation, c.fault.max_restarts);
        note_step_under_way(kRecovering);
        ctx.recovering = true;
        ctx.generation = generation;
        ctx.failure_time = failure_noticed_at() > 0 ? failure_noticed_at() : unix_seconds();
        ctx.resume = nullptr;
        ctx.fault_kill_in_snapshot = -1;
        continue;
      }
      if (launch.world > 1 && c.fault.policy == "restart") {
        print_error(log_prefix_ + e.what() +
                    " (fault.policy = restart: exit status 75 asks the launcher to start the job again)",
                    false);
        return 75;
      }
      if (launch.world > 1)  // fault.policy = abort: the job stops here; where it can continue from
        throw FinalError(fmt::format("{}. {}", e.what(), newest_snapshot_sentence(ckpt_dir)));
      throw;
    }
  }
  return 0;
}

// The checkpoint.dir that the run in `run_dir` saved in its config.toml, when it is set and
// is not `ckpt_dir`; "" otherwise (no config there, or one that does not load). Never throws.
std::string saved_checkpoint_dir(const std::string& run_dir, const std::string& ckpt_dir) {
  try {
    const Config saved = Config::load(run_dir + "/config.toml");
    if (!saved.checkpoint.dir.empty() && resolved_path(saved.checkpoint.dir) != resolved_path(ckpt_dir))
      return saved.checkpoint.dir;
  } catch (const std::exception&) {
  }
  return "";
}

// The snapshot to continue from (--resume DIR or latest; a restart's newest), or null for a
// fresh run, whose checkpoint directory must then hold no snapshots. Throws UserError.
std::shared_ptr<TrainState> load_resume_state(const Config& c, const std::string& resume, const std::string& ckpt_dir,
                                              bool follower, int restart, int rank, const std::string& run_dir) {
  std::shared_ptr<TrainState> state;
  const double load_t0 = unix_seconds();
  if (!resume.empty()) {
    std::vector<std::string> skipped;
    if (resume == "latest") {
      try {
        state = std::make_shared<TrainState>(load_latest(ckpt_dir, c, &skipped));
      } catch (const UserError&) {  // a live run that has saved nothing yet: say that, not "no snapshot"
        if (const long pid = folder_holder(ckpt_dir); !follower && pid != 0)
          throw UserError(in_use_by("checkpoint folder " + ckpt_dir, "run", pid) +
                          " that has saved no usable snapshot yet; wait for it to save one or to end, then resume");
        // the run in --run-dir saved its snapshots elsewhere (its own checkpoint.dir)
        if (const std::string its = follower || run_dir.empty() ? "" : saved_checkpoint_dir(run_dir, ckpt_dir);
            !its.empty() && list_snapshots(its).size() > 0)
          throw UserError("--resume latest looks in " + ckpt_dir + ", but the run in " + run_dir +
                          " saved its snapshots in its checkpoint.dir " + its + ": add --set checkpoint.dir=" + its);
        throw;
      }
    } else {
      state = std::make_shared<TrainState>(load_snapshot(resume, c));
    }
    setup_logging("");
    for (auto& s : skipped) spdlog::warn("skipped damaged snapshot {}", s);
    if (!skipped.empty()) spdlog::warn("falling back to the newest valid snapshot: {}", state->dir);
    log_event("snapshot_loaded", {{"step", state->step}, {"process", rank}, {"restart", restart},
                                  {"started", load_t0}});
    TROUPE_USER_CHECK(state->step < c.train.steps)
        << "snapshot " << state->dir << " is at step " << state->step << " and train.steps = " << c.train.steps
        << ": nothing left to train; raise train.steps";
  } else if (!follower && restart == 0) {
    auto existing = list_snapshots(ckpt_dir);
    if (const long pid = existing.empty() ? 0 : folder_holder(ckpt_dir); pid != 0)  // a live run, not an earlier one
      throw UserError(in_use_by("checkpoint directory " + ckpt_dir, "run", pid) +
                      "; wait for it to end (then continue it with --resume latest), or choose another checkpoint.dir");
    TROUPE_USER_CHECK(existing.empty())
        << "checkpoint directory " << ckpt_dir << " already holds snapshots of an earlier run (newest: step "
        << existing.back().first << "); continue it with --resume latest, or choose another --run-dir or checkpoint.dir";
  }
  return state;
}

// The data side of a job: batches from the loader, text from the tokenizer.
void set_data(JobContext& ctx, const Config& c, const PreparedData& d, std::shared_ptr<BlendLoader> loader,
              std::shared_ptr<Tokenizer> tok) {
  const uint64_t seed = c.train.seed;
  ctx.fill_batch = [loader, seed](int kind, int64_t index, int B, int T, int32_t* in, int32_t* tg) {
    if (kind == 0)
      loader->get_train_batch(seed, index, B, T, in, tg);
    else  // kind 1 + s: validation of source s
      loader->get_val_batch((size_t)(kind - 1), index, B, T, in, tg);
  };
  if (loader->size() > 1)
    for (size_t s = 0; s < loader->size(); ++s) ctx.val_sources.push_back(loader->source(s).name);
  ctx.decode = [tok](const std::vector<int32_t>& ids) {
    // a sample can stop inside a multi-byte character (byte-fallback pieces): show U+FFFD
    std::string text = tok->decode(ids), out;
    std::string_view rest(text);
    for (size_t bad; (bad = find_invalid_utf8(rest)) != std::string_view::npos;) {
      out.append(rest.substr(0, bad));
      out += "\xEF\xBF\xBD";
      rest.remove_prefix(bad + 1);
    }
    out.append(rest);
    return out;
  };
  ctx.sample_start_token = d.eot_id;
  ctx.unigram_entropy = d.unigram_entropy;
  ctx.tokenizer_hash = std::to_string(d.tokenizer_hash);
  ctx.data_key = d.key;
  ctx.tokenizer_path = d.tokenizer_path;
}

// This run owns the checkpoint directory now: the unfinished snapshots of killed writers
// (older than `started`, unix seconds) go, each named; those of live writers are named.
void clean_checkpoint_dir(const std::string& ckpt_dir, double started) {
  std::vector<std::string> kept;
  std::vector<std::pair<std::string, std::string>> emptied;
  // (called once this process holds the folder's lock: make_run_folders)
  for (auto& d : remove_unfinished_snapshots(ckpt_dir, started, &kept, &emptied, /*locked=*/true))
    spdlog::warn("removed {}: an unfinished snapshot left by a writer that was killed", d);
  for (auto& d : remove_half_deleted_snapshots(ckpt_dir))
    spdlog::warn("removed {}: a snapshot half-deleted (no manifest) when its run was killed while replacing or "
                 "retiring it", d);
  for (auto& [d, file] : emptied)
    spdlog::warn("removed the snapshot files of {} (a killed writer's); kept the folder: it holds {}, which no snapshot "
                 "writer makes (move it out of checkpoint.dir)", d, file);
  for (auto& d : kept)
    spdlog::warn("left {} alone: an unfinished snapshot whose writer may still run (remove it once it has stopped)", d);
}

// Where this run writes: the run directory, the checkpoint directory, and whether the run
// directory is the automatic runs/<timestamp> (claimed when made).
struct RunPaths {
  std::string run_dir, ckpt_dir;
  bool automatic = false;
};

// The run and checkpoint directories, checked (nothing is created). Throws UserError.
RunPaths resolve_run_paths(const Config& c, const std::string& run_dir_opt, const std::string& resume_opt,
                           bool follower, const std::string& config_path) {
  RunPaths p;
  const char* launch_id = std::getenv("TROUPE_LAUNCH_ID");
  const bool known_default = launch_id && *launch_id;  // every process knows process 0's default run dir
  p.automatic = run_dir_opt.empty() && !follower && !known_default;  // claimed when made
  p.run_dir = !run_dir_opt.empty() ? run_dir_opt
              : follower           ? (known_default ? default_run_dir() : std::string())
                                   : default_run_dir();
  if (!follower) naming_option("--run-dir", [&] {
      check_run_dir(p.run_dir);
      check_record_files(p.run_dir);
    });
  if (!follower) refuse_inside_snapshot(p.run_dir, "--run-dir");
  // a data cache folder is emptied by a later preparation of it (an interrupted or outdated one)
  if (!follower) refuse_overwriting(p.run_dir, "--run-dir", {}, {c.data.cache_dir});
  refuse_inside_snapshot(c.data.cache_dir, "data.cache_dir");  // a snapshot's retention would delete the cache
  // (a follower knows the default checkpoint directory only from an explicit --run-dir)
  p.ckpt_dir = !c.checkpoint.dir.empty() ? c.checkpoint.dir
               : p.run_dir.empty()        ? std::string()
                                          : p.run_dir + "/checkpoints";
  // a new default run directory (runs/<now>) holds no snapshot to continue from
  TROUPE_USER_CHECK(!(p.automatic && resume_opt == "latest" && c.checkpoint.dir.empty()))
      << "--resume latest continues the run in --run-dir, but none was given (a new run directory " << p.run_dir
      << " would hold no snapshots); pass the earlier run's --run-dir (e.g. runs/<timestamp>), or set checkpoint.dir";
  TROUPE_USER_CHECK(!(follower && resume_opt == "latest" && p.ckpt_dir.empty()))
      << "--resume latest in a job of several processes needs an explicit --run-dir or checkpoint.dir, so that every "
         "process finds the same snapshots";
  if (!c.checkpoint.dir.empty() && !follower) {
    // not on the run's inputs: its data cache (a .lock and retention there), corpus, tokenizer
    std::vector<std::string> dirs = {c.data.cache_dir};
    for (const DataSource& src : c.data.sources) dirs.push_back(src.path);
    refuse_overwriting(p.ckpt_dir, "checkpoint.dir", {c.data.corpus, c.data.tokenizer}, dirs);  // (nor in a snapshot)
    naming_option("checkpoint.dir", [&] { check_checkpoint_dir(p.ckpt_dir); });
  }  // (the run directory is checked above)
  if (!follower) check_folder_roles(c, p.run_dir, p.ckpt_dir, config_path);
  return p;
}

// What to resume from in a start the launcher made after a failure (restart > 0): the
// newest snapshot of ckpt_dir unless --resume names one or the processes recover in place.
// Throws FinalError when the job must not go on (fault.policy = abort, more than
// fault.max_restarts failures). Under fault.policy = abort it first tells troupe launch not
// to start a lost process again.
std::string resume_after_restart(const Config& c, const LaunchEnv& launch, const std::string& ckpt_dir, int restart,
                                 bool in_place, const std::string& resume_opt) {
  std::string resume = resume_opt;
  if (c.fault.policy == "abort" && launch.world > 1)  // tell troupe launch not to start a lost process again
    if (const std::string dir = launch_errdir(); !dir.empty())
      std::ofstream(dir + "/no-respawn") << "fault.policy = abort\n";
  if (restart > 0 && c.fault.policy == "abort")
    throw FinalError(
        "fault.policy = abort: the job stops after a lost process, so a process started again by the launcher does not "
        "join it; continue with --resume latest, or use fault.policy = restart");
  if (restart > 0) {
    const auto snaps = ckpt_dir.empty() ? std::vector<std::pair<int64_t, std::string>>() : list_snapshots(ckpt_dir);
    const char* lost_as = std::getenv("TROUPE_LOST_AS");  // (set by troupe launch: "process 1 (pid P) killed by ...")
    if (restart > c.fault.max_restarts)
      throw FinalError(fmt::format(
          "the job failed {} time(s), more than fault.max_restarts = {}{}: stopping for good. {}", restart,
          c.fault.max_restarts,
          lost_as && *lost_as ? fmt::format(" (the last: {}; the lines above say why)", printable(lost_as, false, 200))
                              : std::string(),
          snaps.empty() ? (c.checkpoint.interval > 0
                               ? fmt::format("No snapshot was written before the failures (checkpoint.interval = {} "
                                             "steps): started again, the job trains from step 1",
                                             c.checkpoint.interval)
                               : std::string("No snapshot was written (checkpoint.interval = 0: none but on a signal); "
                                             "set checkpoint.interval to keep the steps trained across failures"))
                        : fmt::format("The newest snapshot is {} (step {}); continue with --resume latest once the "
                                      "cause is fixed",
                                      snaps.back().second, snaps.back().first)));
    if (resume.empty() && !snaps.empty() && !in_place) resume = "latest";
  }
  return resume;
}

// The run's data: prepared (or found in the cache), its loader and tokenizer, checked
// against the model and the snapshot `state` (may be null).
struct TrainData {
  PreparedData d;
  std::shared_ptr<BlendLoader> loader;
  std::shared_ptr<Tokenizer> tok;
  double seconds = 0;  // how long it took
};

TrainData load_data(const Config& c, const TrainState* state) {
  auto t0 = std::chrono::steady_clock::now();
  TrainData t;
  t.d = prepare(c);
  if (const int sig = train_stop_signal().load(); sig != 0 && sig != SIGUSR1)
    throw UserError(std::string("stopped by ") + stop_signal_label(sig) +
                    " before training began; no run directory was made");
  std::vector<BlendLoader::Source> sources;
  for (const PreparedSource& s : t.d.sources)
    sources.push_back({s.name, s.weight, std::make_shared<const TokenFile>(s.train_path),
                       std::make_shared<const TokenFile>(s.val_path)});
  t.loader = std::make_shared<BlendLoader>(std::move(sources));
  t.tok = std::make_shared<Tokenizer>(Tokenizer::load(t.d.tokenizer_path));
  check_data(c, t.d, *t.loader, *t.tok, state);
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

// Process 0 makes the run's folders: an explicit checkpoint.dir (locked too: a second run
// resuming from it, --resume latest, would otherwise delete this run's snapshots by its
// keep_last retention), the TensorBoard folder, the run directory (created, locked, config
// saved, log file opened; the automatic name claimed, which may change p.run_dir). `fresh`
// records what is made: removed again if the run fails before its first step (a job that
// cannot assemble, a signal while joining), so a refusal leaves no litter.
void make_run_folders(const Config& c, RunPaths& p, FreshFolders& fresh, double started) {
  if (!c.checkpoint.dir.empty() &&
      fs::absolute(p.ckpt_dir).lexically_normal() != fs::absolute(p.run_dir).lexically_normal()) {
    fresh.will_create(p.ckpt_dir);
    lock_folder(p.ckpt_dir, "checkpoint.dir",
                "run (its snapshots would be removed by this run's checkpoint.keep_last)",
                "choose another checkpoint.dir", "checkpoint.dir");
  }
  if (!c.train.tensorboard_dir.empty()) {
    fresh.will_create(c.train.tensorboard_dir);
    create_event_dir(c.train.tensorboard_dir);
  }
  if (p.automatic) {  // a run started in the same second may have taken the name since
    std::string made;
    p.run_dir = claim_run_dir(p.run_dir, &made);
    fresh.made(made);
    if (c.checkpoint.dir.empty()) p.ckpt_dir = p.run_dir + "/checkpoints";
  } else {
    fresh.will_create(p.run_dir);
  }
  const int lock_fd = make_run_dir(p.run_dir);
  (void)lock_fd;
  if (c.checkpoint.dir.empty()) {  // the run's own checkpoints folder: another run may name it as its checkpoint.dir
    fresh.will_create(p.ckpt_dir);
    lock_folder(p.ckpt_dir, "the run's checkpoints folder",
                "run as its checkpoint.dir (each run's checkpoint.keep_last would remove the other's snapshots)",
                "pass another --run-dir", "--run-dir");
  }
  setup_logging(p.run_dir);
  const std::string saved = save_config(c, p.run_dir);
  spdlog::info("run directory: {} (config saved as {})", p.run_dir, fs::path(saved).filename().string());
  clean_checkpoint_dir(p.ckpt_dir, started);
}

// The job's context: data, folders, snapshot to continue from, the launch and its restart.
void fill_job_context(JobContext& ctx, const Config& c, const TrainData& data, const RunPaths& p, bool follower,
                      std::shared_ptr<TrainState> state, const LaunchEnv& launch, const std::string& secret,
                      int restart, bool in_place) {
  set_data(ctx, c, data.d, data.loader, data.tok);
  ctx.run_dir = p.run_dir;
  ctx.trace_path = trace_path_;
  ctx.checkpoint_dir = follower ? std::string("(process 0's checkpoint writer)") : p.ckpt_dir;
  ctx.resume = std::move(state);
  ctx.stop_signal = &train_stop_signal();
  ctx.launch = launch;
  ctx.job_secret = secret;
  if (follower) ctx.run_dir.clear();
  for (char** e = environ; e && *e; ++e) {  // a misspelled switch would inject nothing, silently
    const std::string var(*e, std::strcspn(*e, "="));
    static const char* const kSwitches[] = {"TROUPE_FAULT_KILL_RANK",      "TROUPE_FAULT_KILL_STEP",
                                            "TROUPE_FAULT_SIGNAL",         "TROUPE_FAULT_PHASE",
                                            "TROUPE_FAULT_KILL_IN_SNAPSHOT", "TROUPE_FAULT_DELAY_RANK",
                                            "TROUPE_FAULT_DELAY_STEP",     "TROUPE_FAULT_DELAY_S",
                                            "TROUPE_FAULT_IGNORE_REFUSAL"};
    // another TROUPE_* name troupe does not read (TROUPE_WORLDSIZE=2: the job would run alone)
    static const char* const kKnown[] = {"TROUPE_RANK", "TROUPE_WORLD_SIZE", "TROUPE_LOCAL_RANK", "TROUPE_LOCAL_WORLD_SIZE",
                                         "TROUPE_COORDINATOR", "TROUPE_JOB_SECRET", "TROUPE_JOB_SECRET_FILE",
                                         "TROUPE_RESTART_COUNT", "TROUPE_RESPAWN", "TROUPE_LAUNCH_ERRDIR",
                                         "TROUPE_LAUNCH_ID", "TROUPE_LAUNCH_RANK", "TROUPE_FAILURE_TIME", "TROUPE_LOST_AS", "TROUPE_STOP_SIGNALS_HELD",
                                         "TROUPE_CACHE_DIR", "TROUPE_EVENT_LOG", "TROUPE_GEMM", "TROUPE_NO_PROGRESS_BAR",
                                         "TROUPE_REQUIRE_GPU", "TROUPE_KEEP_SCRATCH", "TROUPE_BIN"};
    if (var.rfind("TROUPE_", 0) == 0 && var.rfind("TROUPE_FAULT_", 0) != 0 &&
        std::find_if(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return var == k; }) == std::end(kKnown))
      std::fprintf(stderr, "warning: environment variable %s is not one troupe reads (a misspelling of TROUPE_RANK, "
                           "TROUPE_WORLD_SIZE, TROUPE_COORDINATOR, TROUPE_JOB_SECRET...?); it is ignored\n",
                   printable(var, false, 80).c_str());
    if (var.rfind("TROUPE_FAULT_", 0) != 0) continue;
    TROUPE_USER_CHECK(std::find_if(std::begin(kSwitches), std::end(kSwitches),
                                   [&](const char* k) { return var == k; }) != std::end(kSwitches))
        << "environment variable " << printable(var, false, 80) << " is no fault switch of troupe's; the tests' switches "
        << "are TROUPE_FAULT_KILL_RANK, _KILL_STEP, _SIGNAL, _PHASE, _KILL_IN_SNAPSHOT, _DELAY_RANK, _DELAY_STEP, "
        << "_DELAY_S and _IGNORE_REFUSAL (docs/multiprocess.md): fix its name or unset it";
  }
  if (const char* f = std::getenv("TROUPE_FAULT_KILL_IN_SNAPSHOT")) {  // (the tests' fault injection: checked)
    char* end = nullptr;
    const long long k = std::strtoll(f, &end, 10);
    TROUPE_USER_CHECK(*f && *end == '\0' && k >= 1 && k <= c.train.steps)
        << "TROUPE_FAULT_KILL_IN_SNAPSHOT='" << f << "' is not a step from 1 to train.steps = " << c.train.steps
        << "; it is a fault-injection switch of the tests (docs/multiprocess.md): fix it or unset it";
    if (restart == 0) ctx.fault_kill_in_snapshot = k;
  }
  if (c.checkpoint.memory_interval > 0 && launch.world > 1 && !in_place && !follower)
    spdlog::warn("checkpoint.memory_interval = {} has no effect here: only an in-place recovery (fault.policy = "
                 "restart under troupe launch --respawn process) reads memory snapshots; set it to 0 to save their cost",
                 c.checkpoint.memory_interval);
  ctx.memory = std::make_shared<MemoryStore>();
  ctx.recovering = in_place && restart > 0;
  ctx.generation = restart;
  if (const double ft = launch_env_failure_time(); ft > 0 && restart > 0) ctx.failure_time = ft;
  ctx.recovery_ckpt_dir = p.ckpt_dir;
  // what a forced stop names (core/stop_notice.h): the newest snapshot, this start's recovery
  note_saves_snapshots(!follower && !p.ckpt_dir.empty());
  if (ctx.recovering) note_step_under_way(kRecovering);
  const auto snaps = p.ckpt_dir.empty() ? std::vector<std::pair<int64_t, std::string>>() : list_snapshots(p.ckpt_dir);
  if (!snaps.empty() && (!ctx.resume || snaps.back().first >= ctx.resume->step))
    note_newest_snapshot(snaps.back().first, snaps.back().second);
  else if (ctx.resume)
    note_newest_snapshot(ctx.resume->step, ctx.resume->dir);
}

// Process 0 of a start the launcher made after a failure says where it continues from.
void log_restart(const Config& c, const JobContext& ctx, int rank, int restart) {
  if (ctx.recovering)
    spdlog::warn("process {} started again (restart {} of at most {}, fault.policy = restart): the job continues from "
                 "the newest complete snapshot the processes hold, in memory or on disk",
                 rank, restart, c.fault.max_restarts);
  else if (restart > 0)
    spdlog::warn("restart {} of at most {} (fault.policy = restart): {}", restart, c.fault.max_restarts,
                 ctx.resume ? fmt::format("continuing from {} (step {}); the failed start's steps after it are repeated "
                                          "(metrics.jsonl marks the resume)",
                                          ctx.resume->dir, ctx.resume->step)
                            : std::string("no snapshot yet: starting from step 1"));
}

}  // namespace

int cmd_train(const Config& c, const std::string& run_dir_opt, const std::string& resume_opt,
              const std::string& config_path) {
  // Several processes: process 0 owns the run directory, the logs and the snapshots; the
  // others only run their workers.
  const double started = unix_seconds();
  const LaunchEnv launch = read_launch_env();
  (void)launch_local_world_size(launch.world);  // checked before anything is said or written (read again later)
  if (launch.world > 1) {  // every line says which process wrote it
    log_prefix_ = fmt::format("[process {}] ", launch.rank);
    setup_logging("");
  }
  const bool follower = launch.world > 1 && launch.rank != 0;
  if (launch.source == "none" && std::getenv("TROUPE_COORDINATOR"))  // (left exported? a half-set world is refused)
    std::fprintf(stderr, "warning: TROUPE_COORDINATOR is set, but no TROUPE_RANK and TROUPE_WORLD_SIZE (nor SLURM's "
                         "or Open MPI's) make this one of several processes: it trains alone and the coordinator is "
                         "not used; unset TROUPE_COORDINATOR, or start the job with troupe launch\n");
  // from here a stop signal is a request (a flag): before the first step it ends the
  // command at the next check with exit 2 and no folders left; from the first step on it
  // saves a snapshot and stops
  install_stop_signals();
  const std::string secret = check_job_of_several(c, launch);
  // Everything that can be refused is refused before anything is written.
  RunPaths paths = resolve_run_paths(c, run_dir_opt, resume_opt, follower, config_path);
  // fault.policy = restart: troupe launch starts the job again after a lost process
  // (TROUPE_RESTART_COUNT > 0); it continues from the newest complete snapshot, if any.
  const int restart_env = launch_env_int("TROUPE_RESTART_COUNT", 0, 1 << 20, 0);  // (checked even in a 1-process run)
  const int restart = launch.world > 1 ? restart_env : 0;
  (void)launch_env_failure_time();  // checked here, before anything is written (read again for the context)
  // troupe launch --respawn process (its default): only a lost process is started again;
  // the others recover in place, and all agree at join on the state to continue from
  const std::string respawn = launch_env_respawn();  // (checked even in a 1-process run)
  const bool in_place = launch.world > 1 && c.fault.policy == "restart" && respawn == "process";
  const std::string resume = resume_after_restart(c, launch, paths.ckpt_dir, restart, in_place, resume_opt);
  check_memory(c, !resume.empty());  // before a snapshot is loaded: under a memory limit that load failed (exit 1)
  // a live run's directory, whatever its checkpoint.dir: named now, not as "no snapshot there"
  // (--resume latest) or after the data is loaded (trial 45, L3)
  // (a holder that wrote no pid is not troupe: make_run_dir names it and its command)
  if (const long pid = follower || restart > 0 || paths.automatic ? 0 : folder_holder(paths.run_dir); pid > 0) {
    const std::string its_dir = saved_checkpoint_dir(paths.run_dir, paths.ckpt_dir);
    throw UserError(in_use_by("run directory '" + paths.run_dir + "'", "run", pid) + "; wait for it to end" +
                    (resume.empty() ? std::string()
                     : its_dir.empty()
                         ? std::string(" (then continue it with --resume latest)")
                         : " (then continue it with --resume latest --set checkpoint.dir=" + its_dir +
                               ": its snapshots are there)") +
                    ", or pass another --run-dir");
  }
  std::shared_ptr<TrainState> state = naming_option(
      "--resume", [&] { return load_resume_state(c, resume, paths.ckpt_dir, follower, restart, launch.rank, paths.run_dir); });
  check_before_writing(c, launch, follower, paths.ckpt_dir);
  const TrainData data = load_data(c, state.get());
  // Now the folders; the first thing written: nothing else exists yet if it fails
  FreshFolders fresh(paths.run_dir);
  if (!follower) make_run_folders(c, paths, fresh, started);
  if (!follower) spdlog::info("data: {} train tokens, {} val tokens ({:.1f} s); unigram entropy {:.4f} nats/token",
                              data.d.train_tokens, data.d.val_tokens, data.seconds, data.d.unigram_entropy);
  JobContext ctx;
  fill_job_context(ctx, c, data, paths, follower, state, launch, secret, restart, in_place);
  if (!follower) log_restart(c, ctx, launch.rank, restart);
  JobResult r;
  if (int rc = run_with_recovery(c, ctx, launch, in_place, restart, paths.ckpt_dir, r); rc != 0) return rc;
  const int rc = report_result(c, r, paths.ckpt_dir, state.get(), data.d.unigram_entropy);
  report_train_log_losses();
  return rc;
}

}  // namespace troupe::cli
