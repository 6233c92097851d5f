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
#include "actors/job_plan.h"
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
#include <vector>
#include <cstring>
#include <iterator>
#include "cli/common.h"
#include "cli/train_checks.h"
#include "cli/train_folders.h"
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
    // the manifest keeps the hash in decimal; shown in hex, as the "data ready ... tokenizer
    // <hash>" line and meta.json show it (trial 58, F2)
    const std::string& saved = state->tokenizer_hash;
    const bool digits = saved.size() <= 20 && saved.find_first_not_of("0123456789") == std::string::npos;
    TROUPE_USER_CHECK(saved == std::to_string(d.tokenizer_hash))
        << "snapshot " << state->dir << " was trained with another tokenizer (hash "
        << (digits ? hash_hex(std::strtoull(saved.c_str(), nullptr, 10)) : printable(saved, false, 40))
        << ", the data now gives " << hash_hex(d.tokenizer_hash) << "): the data changed since that snapshot (a "
        << "source's or the corpus's contents, or data.tokenizer); restore the data it trained on and resume, or train "
        << "anew without --resume";
  }
  TROUPE_USER_CHECK(tok.vocab_size() == c.model.vocab_size)
      << "the tokenizer " << d.tokenizer_path << " has " << tok.vocab_size() << " tokens but model.vocab_size = "
      << c.model.vocab_size << "; set model.vocab_size = " << tok.vocab_size() << " or use a matching data.tokenizer";
}

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
        // (a lost process's line is on the screen already, as an error: not said twice, trial 51 F6)
        const bool said = failure_logged() == e.what();
        spdlog::warn("{}(fault.policy = restart: recovering in place, restart {} of at most {}; waiting for every "
                     "process to join again)",
                     said ? std::string() : std::string(e.what()) + "\n", generation, c.fault.max_restarts);
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

// The environment's TROUPE_* variables: a name troupe does not read is warned about (a
// misspelling), a TROUPE_FAULT_* name that is no switch, or a switch's value it cannot mean,
// is refused (UserError). Called before anything is written (trial 53, F1: the run directory
// had its config.toml and train.log by then).
// The names of `known` nearest to `name` (nearest_names: distance at most 3, at most 3 of
// them), joined by " or "; when none is that near, the launcher's variables.
template <size_t N>
std::string near_names(const std::string& name, const char* const (&known)[N]) {
  const auto near = nearest_names(name, std::vector<std::string_view>(std::begin(known), std::end(known)));
  if (near.empty()) return "TROUPE_RANK, TROUPE_WORLD_SIZE, TROUPE_COORDINATOR, TROUPE_JOB_SECRET...";
  return join(near, " or ");
}

void check_environment_switches(const Config& c, const LaunchEnv& launch) {
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
                                         "TROUPE_REQUIRE_GPU", "TROUPE_KEEP_SCRATCH", "TROUPE_BIN",
                                         "TROUPE_GNUPLOT_TIMEOUT_S"};  // (train --trace-png draws with gnuplot)
    if (var.rfind("TROUPE_", 0) == 0 && var.rfind("TROUPE_FAULT_", 0) != 0 &&
        std::find_if(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return var == k; }) == std::end(kKnown))
      std::fprintf(stderr, "warning: environment variable %s is not one troupe reads (a misspelling of %s?); it is "
                           "ignored\n",
                   printable(var, false, 80).c_str(), near_names(var, kKnown).c_str());
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
    (void)k;
  }
  FaultSwitches unused;  // every kill and delay switch's value, checked as the job's plan will read it
  read_fault_switches([](const char* n) { return std::getenv(n); }, -1, std::max(1, launch.world), c.train.steps, 0,
                      unused);
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
  if (const char* f = std::getenv("TROUPE_FAULT_KILL_IN_SNAPSHOT"); f && restart == 0)
    ctx.fault_kill_in_snapshot = std::strtoll(f, nullptr, 10);  // (checked: check_environment_switches)
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
  if (!follower && restart == 0) refuse_live_run_dir(paths, !resume.empty());
  std::shared_ptr<TrainState> state = naming_option(
      "--resume", [&] { return load_resume_state(c, resume, paths.ckpt_dir, follower, restart, launch.rank, paths.run_dir); });
  check_before_writing(c, launch, follower, paths.ckpt_dir);
  check_environment_switches(c, launch);
  const TrainData data = load_data(c, state.get());
  // Now the folders; the first thing written: nothing else exists yet if it fails
  FreshFolders fresh(paths.run_dir);
  if (!follower) make_run_folders(c, paths, fresh, started);
  // train.log's lost lines are counted on every way out, an error's too (trial 59, L4: a run
  // that a full disk ended with exit 2 counted metrics.jsonl's only)
  struct LogLossReport {
    ~LogLossReport() { report_train_log_losses(); }
  } log_loss_report;
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
