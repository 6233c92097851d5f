// troupe — the command line.
//   troupe train    --config FILE [--set section.key=value ...] [--run-dir DIR]
//   troupe tokenize --config FILE [--set ...]      corpus -> tokenizer + token files (cached)
// Exit codes: 0 success, 2 bad input (config, corpus, paths, layout), 1 any other failure.
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <arpa/inet.h>
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
#include "checkpoint/export.h"
#include "checkpoint/snapshot.h"
#include "core/launch_env.h"
#include "cli/launch.h"
#include "core/config.h"
#include "core/error.h"
#include "core/events.h"
#include "datasets/corpus.h"
#include "datasets/loader.h"
#include "datasets/prepare.h"
#include "datasets/tokenizer.h"
#include "model/gpt.h"
#include "stages/schedule.h"
#include "stages/simulator.h"
#include "stages/stage.h"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

std::string trace_path_;
std::string log_prefix_;  // "[process r] " in a job of several processes

// One "error: ..." report in a single write, so the lines of several processes sharing a
// terminal do not interleave.
void print_error(const std::string& text) {
  std::fflush(stdout);
  std::cerr.flush();
  const std::string line = "error: " + text + "\n";
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, line.data(), line.size());
}
std::shared_ptr<spdlog::logger> file_log_;  // train.log only (errors: the console gets them from main)

Config load_config(const std::string& path, const std::vector<std::string>& sets) {
  Config c = Config::load(path);
  for (auto& s : sets) c.set(s);
  c.validate();
  return c;
}

std::string timestamp() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

// Checks, without creating anything, that the run directory can be created or written.
void check_run_dir(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  if (fs::exists(p, ec)) {
    TROUPE_USER_CHECK(fs::is_directory(p, ec)) << "run directory '" << dir
                                               << "' exists and is not a directory; pass --run-dir with a folder";
    TROUPE_USER_CHECK(::access(p.c_str(), W_OK) == 0)
        << "run directory '" << dir << "' is not writable; pass --run-dir with a writable folder";
    return;
  }
  fs::path parent = p.parent_path();
  while (!parent.empty() && !fs::exists(parent, ec)) parent = parent.parent_path();
  TROUPE_USER_CHECK(fs::is_directory(parent, ec) && ::access(parent.c_str(), W_OK) == 0)
      << "cannot create run directory '" << dir << "': " << parent.string()
      << (fs::is_directory(parent, ec) ? " is not writable" : " is not a directory")
      << "; pass --run-dir with a writable folder";
}

// Creates the run directory and takes its lock: one troupe process per run directory.
int make_run_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TROUPE_USER_CHECK(!ec && fs::is_directory(dir))
      << "cannot create run directory '" << dir << "' (" << (ec ? ec.message() : "not a directory")
      << "); pass --run-dir with a writable folder";
  const std::string lock = dir + "/.lock";
  int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TROUPE_USER_CHECK(fd >= 0) << "cannot create " << lock << " (" << std::strerror(errno)
                             << "); pass --run-dir with a writable folder";
  TROUPE_USER_CHECK(::flock(fd, LOCK_EX | LOCK_NB) == 0)
      << "run directory '" << dir << "' is in use by another troupe process; wait for it or pass another --run-dir";
  return fd;  // held until the process exits
}

// Saves the resolved config as DIR/config.toml; never overwrites a different one (a new
// one goes beside it as config-<timestamp>[-n].toml, created exclusively).
std::string save_config(const Config& c, const std::string& dir) {
  std::string text = c.to_toml();
  std::string path = dir + "/config.toml";
  if (fs::exists(path)) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str() == text) return path;
    for (int n = 0;; ++n) {
      path = dir + "/config-" + timestamp() + (n ? "-" + std::to_string(n) : "") + ".toml";
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::close(fd);
        break;
      }
      TROUPE_USER_CHECK(errno == EEXIST) << "cannot write " << path << " (" << std::strerror(errno)
                                         << "); pass --run-dir with a writable folder";
    }
  }
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    TROUPE_USER_CHECK(out.good()) << "cannot write " << tmp << "; pass --run-dir with a writable folder";
  }
  fs::rename(tmp, path);
  return path;
}

// Bytes available for this job (MemAvailable), 0 if unknown.
double available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024.0;
  return 0;
}

// Refuses, before anything is allocated, a job that cannot fit in memory: fp32 weights,
// gradients and AdamW moments (16 bytes per parameter, the tied embedding twice when
// split; mixed precision adds the bf16 GEMM copy), stashed activations (16-bit in mixed precision) (1F1B keeps at most min(M, P - s) microbatches on stage s,
// GPipe M) and the logits of a microbatch (twice: logits and their gradient).
void check_memory(const Config& c) {
  const GPTConfig g = GPTConfig::from(c.model);
  const int P = c.parallel.pp, M = c.parallel.microbatches, V = c.parallel.chunks;
  const int mbB = c.train.batch_size / (c.parallel.dp * M), T = c.train.seq_len;
  const int DP = c.parallel.dp;
  // value + gradient on every replica, fp32 master + 2 moments sharded over DP (ZeRO-1)
  double params = (8.0 * DP + 12.0) * (g.n_params() + (P * V > 1 ? (double)g.V * g.C : 0.0));
  const double full_layer = activation_bytes_per_layer(mbB, T, g.C, g.NH);
  // mixed precision: the stash holds 16-bit values (+ one fp32 block of scratch per stage)
  const bool half = c.train.precision != "fp32" && c.train.recompute != "full";
  if (c.train.precision != "fp32") params += 2.0 * DP * (g.n_params() + (P * V > 1 ? (double)g.V * g.C : 0.0));
  const double per_layer = c.train.recompute == "full" ? 4.0 * mbB * T * g.C : half ? full_layer / 2 : full_layer;
  // (microbatch, chunk) pairs stashed on each stage: the schedule's simulated peak
  Schedule sched = make_schedule(c.parallel.schedule, P, M, V);
  validate_schedule(sched);
  const SimResult sim = simulate(sched, Costs{});
  double acts = 0;
  for (int st = 0; st < P; ++st) acts += sim.peak_inflight[st] * ((double)g.L / (P * V)) * per_layer;
  acts += 2.0 * 4.0 * mbB * T * g.V;                        // logits + dlogits of one microbatch
  if (c.train.recompute == "full" || half) acts += full_layer * P;  // one recompute/unpack buffer per stage
  acts *= DP;                                               // every replica
  const double need = params + acts;
  const double have = available_memory();
  if (have <= 0) return;
  auto gib = [](double b) { return fmt::format("{:.1f} GiB", b / (1024.0 * 1024 * 1024)); };
  TROUPE_USER_CHECK(need < 0.9 * have)
      << "this job needs about " << gib(need) << " (parameters, gradients and AdamW state " << gib(params)
      << ", activations " << gib(acts) << ") but " << gib(have)
      << " are available; use a smaller model, train.batch_size, train.seq_len, more parallel.microbatches, "
      << (DP > 1 ? "fewer parallel.dp replicas (each holds the weights and gradients), " : "")
      << "or train.recompute = \"full\"";
}

void setup_logging(const std::string& run_dir) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  std::vector<spdlog::sink_ptr> sinks{console};
  if (!run_dir.empty()) {
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(run_dir + "/train.log");
    sinks.push_back(file);
    file_log_ = std::make_shared<spdlog::logger>("troupe-file", file);
    file_log_->set_pattern("[%H:%M:%S] " + log_prefix_ + "%v");
    file_log_->flush_on(spdlog::level::info);
  }
  auto logger = std::make_shared<spdlog::logger>("troupe", sinks.begin(), sinks.end());
  logger->set_pattern("[%H:%M:%S] " + log_prefix_ + "%v");
  logger->flush_on(spdlog::level::info);  // train.log is complete up to the last line, even if killed
  spdlog::set_default_logger(logger);
}

PreparedData prepare(const Config& c) {
  return prepare_data(c.data, c.model.vocab_size, [](const std::string& s) { spdlog::info("{}", s); });
}

int cmd_tokenize(const Config& c) {
  setup_logging("");
  auto d = prepare(c);
  spdlog::info("data ready in {}: {} train tokens, {} val tokens, vocab {}, unigram entropy {:.4f} nats/token", d.dir,
               d.train_tokens, d.val_tokens, d.vocab_size, d.unigram_entropy);
  return 0;
}

// The default run directory: runs/<timestamp>, or runs/<launch id> for every process and
// every restart of one `troupe launch` (TROUPE_LAUNCH_ID).
std::string default_run_dir() {
  if (const char* id = std::getenv("TROUPE_LAUNCH_ID"); id && *id) return std::string("runs/") + id;
  std::string dir = "runs/" + timestamp();
  for (int i = 1; fs::exists(dir); ++i) dir = "runs/" + timestamp() + "-" + std::to_string(i);
  return dir;
}

// SIGUSR1 / SIGTERM / SIGINT: snapshot the current step and stop (exit 0). A second
// SIGTERM or SIGINT while that is under way ends the process at once.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal.exchange(sig) != 0 && sig != SIGUSR1) _exit(128 + sig);
}
void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGUSR1, SIGTERM, SIGINT}) sigaction(s, &sa, nullptr);
}

// The job secret of a multi-process run: TROUPE_JOB_SECRET (troupe launch sets it), or the
// first line of the file TROUPE_JOB_SECRET_FILE.
std::string job_secret() {
  if (const char* s = std::getenv("TROUPE_JOB_SECRET"); s && *s) return s;
  if (const char* f = std::getenv("TROUPE_JOB_SECRET_FILE"); f && *f) {
    std::ifstream in(f);
    TROUPE_USER_CHECK(in.good()) << "TROUPE_JOB_SECRET_FILE=" << f << " cannot be read; point it at a readable file";
    std::string line;
    std::getline(in, line);
    return line;
  }
  throw UserError(
      "this process is one of several (TROUPE_WORLD_SIZE, SLURM_NTASKS or OMPI_COMM_WORLD_SIZE > 1) but has no job "
      "secret; start it with troupe launch, or export the same TROUPE_JOB_SECRET=$(openssl rand -hex 32) to every "
      "process");
}

// A failure after which a job must not be started again (fault.max_restarts exceeded).
struct FinalError : Error {
  using Error::Error;
};

int cmd_train(const Config& c, const std::string& run_dir_opt, const std::string& resume_opt) {
  // Several processes: process 0 owns the run directory, the logs and the snapshots; the
  // others only run their workers.
  const LaunchEnv launch = read_launch_env();
  if (launch.world > 1) {  // every line says which process wrote it
    log_prefix_ = fmt::format("[process {}] ", launch.rank);
    setup_logging("");
  }
  const bool follower = launch.world > 1 && launch.rank != 0;
  const std::string secret = launch.world > 1 ? job_secret() : std::string();
  if (launch.world > 1) {
    TROUPE_USER_CHECK(secret.size() >= 16) << "the job secret has " << secret.size()
                                           << " characters; use at least 16 (e.g. openssl rand -hex 32)";
    const int workers = c.parallel.pp * c.parallel.tp * c.parallel.dp;
    TROUPE_USER_CHECK(workers % launch.world == 0)
        << "parallel.dp x pp x tp = " << workers << " workers cannot be spread evenly over " << launch.world
        << " processes; use a process count that divides " << workers;
  }
  if (launch.world > 1 && launch.rank == 0) {  // the coordinator's address, before anything is written
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)launch.port);
    if (inet_pton(AF_INET, launch.host.c_str(), &a.sin_addr) == 1) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      const bool ok = fd >= 0 && ::bind(fd, (sockaddr*)&a, sizeof a) == 0;
      const int err = errno;
      if (fd >= 0) ::close(fd);
      TROUPE_USER_CHECK(ok) << "process 0 cannot listen on " << launch.host << ":" << launch.port << " ("
                            << std::strerror(err) << "); choose a free port and a local address in TROUPE_COORDINATOR";
    }
  }
  // Everything that can be refused is refused before anything is written.
  const char* launch_id = std::getenv("TROUPE_LAUNCH_ID");
  const bool known_default = launch_id && *launch_id;  // every process knows process 0's default run dir
  const std::string run_dir = !run_dir_opt.empty() ? run_dir_opt
                              : follower           ? (known_default ? default_run_dir() : std::string())
                                                   : default_run_dir();
  if (!follower) check_run_dir(run_dir);
  // (a follower knows the default checkpoint directory only from an explicit --run-dir)
  const std::string ckpt_dir = !c.checkpoint.dir.empty() ? c.checkpoint.dir
                               : run_dir.empty() ? std::string()
                                                 : run_dir + "/checkpoints";
  TROUPE_USER_CHECK(!(follower && resume_opt == "latest" && ckpt_dir.empty()))
      << "--resume latest in a job of several processes needs an explicit --run-dir or checkpoint.dir, so that every "
         "process finds the same snapshots";
  if (!c.checkpoint.dir.empty() && !follower) {  // (the run directory itself is checked above)
    fs::path p = fs::absolute(ckpt_dir);
    while (!p.empty() && !fs::exists(p) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
    TROUPE_USER_CHECK(fs::is_directory(p) && ::access(p.c_str(), W_OK) == 0)
        << "checkpoint.dir = '" << ckpt_dir << "' cannot be created (" << p.string()
        << (fs::is_directory(p) ? " is not writable" : " is not a directory") << "); choose a writable directory";
    // really try (root passes access() on /proc): create it and a probe file, then remove the probe
    std::error_code ec;
    fs::create_directories(ckpt_dir, ec);
    const std::string probe = ckpt_dir + "/.troupe-probe-" + std::to_string(::getpid());
    bool ok = !ec && fs::is_directory(ckpt_dir);
    if (ok) {
      std::ofstream f(probe);
      ok = f.good() && (f << "x").good();
    }
    fs::remove(probe, ec);
    TROUPE_USER_CHECK(ok) << "checkpoint.dir = '" << ckpt_dir
                          << "' cannot be created or written; choose a writable directory";
  }
  // fault.policy = restart: troupe launch starts the job again after a lost process
  // (TROUPE_RESTART_COUNT > 0); it continues from the newest complete snapshot, if any.
  const int restart = launch.world > 1 && std::getenv("TROUPE_RESTART_COUNT")
                          ? std::atoi(std::getenv("TROUPE_RESTART_COUNT")) : 0;
  // troupe launch --respawn process (its default): only a lost process is started again;
  // the others recover in place, and all agree at join on the state to continue from
  const char* respawn = std::getenv("TROUPE_RESPAWN");
  const bool in_place = launch.world > 1 && c.fault.policy == "restart" && respawn && std::string(respawn) == "process";
  std::string resume = resume_opt;
  if (restart > 0 && c.fault.policy == "abort")
    throw FinalError(
        "fault.policy = abort: the job stops after a lost process, so a process started again by the launcher does not "
        "join it; continue with --resume latest, or use fault.policy = restart");
  if (restart > 0) {
    const auto snaps = ckpt_dir.empty() ? std::vector<std::pair<int64_t, std::string>>() : list_snapshots(ckpt_dir);
    if (restart > c.fault.max_restarts)
      throw FinalError(fmt::format(
          "the job failed {} time(s), more than fault.max_restarts = {}: stopping for good. {}", restart,
          c.fault.max_restarts,
          snaps.empty() ? std::string("No snapshot was written; raise checkpoint.interval's frequency")
                        : fmt::format("The newest snapshot is {} (step {}); continue with --resume latest once the "
                                      "cause is fixed",
                                      snaps.back().second, snaps.back().first)));
    if (resume.empty() && !snaps.empty() && !in_place) resume = "latest";
  }
  std::shared_ptr<TrainState> state;
  const double load_t0 = unix_seconds();
  if (!resume.empty()) {
    std::vector<std::string> skipped;
    if (resume == "latest") {
      state = std::make_shared<TrainState>(load_latest(ckpt_dir, c, &skipped));
    } else {
      state = std::make_shared<TrainState>(load_snapshot(resume, c));
    }
    setup_logging("");
    for (auto& s : skipped) spdlog::warn("skipped damaged snapshot {}", s);
    if (!skipped.empty()) spdlog::warn("falling back to the newest valid snapshot: {}", state->dir);
    log_event("snapshot_loaded", {{"step", state->step}, {"process", launch.rank}, {"restart", restart},
                                  {"started", load_t0}});
    TROUPE_USER_CHECK(state->step < c.train.steps)
        << "snapshot " << state->dir << " is at step " << state->step << " and train.steps = " << c.train.steps
        << ": nothing left to train; raise train.steps";
  } else if (!follower && restart == 0) {
    auto existing = list_snapshots(ckpt_dir);
    TROUPE_USER_CHECK(existing.empty())
        << "checkpoint directory " << ckpt_dir << " already holds snapshots of an earlier run (newest: step "
        << existing.back().first << "); continue it with --resume latest, or choose another --run-dir or checkpoint.dir";
  }
  {
    Schedule s = make_schedule(c.parallel.schedule, c.parallel.pp, c.parallel.microbatches, c.parallel.chunks);
    validate_schedule(s);
    TROUPE_USER_CHECK(!(c.parallel.sequence_parallel && c.parallel.tp > 1 && s.split_backward))
        << "parallel.sequence_parallel does not combine with a split-backward (W) schedule such as "
        << c.parallel.schedule << " yet; use a schedule without W actions or turn sequence parallelism off";
  }
  check_memory(c);
  if (!trace_path_.empty()) {  // refuse an unwritable trace path now, not after training
    std::ofstream probe(trace_path_, std::ios::app);
    TROUPE_USER_CHECK(probe.good()) << "cannot write the trace file '" << trace_path_ << "'; pass a writable --trace path";
  }
  setup_logging("");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  if (c.train.threads > (int)cores)
    spdlog::warn("train.threads = {} exceeds the {} cores here: workers will oversubscribe them", c.train.threads, cores);
  const int workers = c.parallel.pp * c.parallel.tp * c.parallel.dp;
  if (c.train.threads > 0 && c.train.threads < workers)
    spdlog::warn("train.threads = {} is fewer than the {} stage workers: each still gets 1 thread ({} in all)",
                 c.train.threads, workers, workers);
  auto t0 = std::chrono::steady_clock::now();
  auto d = prepare(c);
  auto loader = std::make_shared<BatchLoader>(d.train_path, d.val_path);
  // Token files are checked against the model before anything trains.
  for (const TokenFile* f : {&loader->train(), &loader->val()}) {
    f->check_tokenizer(d.tokenizer_hash);
    f->validate(c.model.vocab_size);
  }
  TROUPE_USER_CHECK(loader->train().size() >= (uint64_t)c.train.seq_len + 1)
      << "the train split has " << loader->train().size() << " tokens, fewer than train.seq_len + 1 = "
      << c.train.seq_len + 1 << "; use a bigger corpus or a smaller train.seq_len";
  TROUPE_USER_CHECK(loader->val().size() >= (uint64_t)c.train.seq_len + 1)
      << "the validation split has " << loader->val().size() << " tokens, fewer than train.seq_len + 1 = "
      << c.train.seq_len + 1 << "; raise data.val_fraction or lower train.seq_len";
  auto tok = std::make_shared<Tokenizer>(Tokenizer::load(d.tokenizer_path));
  if (state && !state->tokenizer_hash.empty()) {
    TROUPE_USER_CHECK(state->tokenizer_hash == std::to_string(d.tokenizer_hash))
        << "snapshot " << state->dir << " was trained with another tokenizer (hash " << state->tokenizer_hash
        << ", the data now gives " << d.tokenizer_hash << "); resume with the same corpus and data.tokenizer";
  }
  TROUPE_USER_CHECK(tok->vocab_size() == c.model.vocab_size)
      << "the tokenizer " << d.tokenizer_path << " has " << tok->vocab_size() << " tokens but model.vocab_size = "
      << c.model.vocab_size << "; set model.vocab_size = " << tok->vocab_size() << " or use a matching data.tokenizer";
  const double data_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Now the run directory: created, locked, config saved, log file opened.
  if (!follower) {
    const int lock_fd = make_run_dir(run_dir);
    (void)lock_fd;
    setup_logging(run_dir);
    const std::string saved = save_config(c, run_dir);
    spdlog::info("run directory: {} (config saved as {})", run_dir, fs::path(saved).filename().string());
  }
  if (!follower) spdlog::info("data: {} train tokens, {} val tokens ({:.1f} s); unigram entropy {:.4f} nats/token", d.train_tokens,
               d.val_tokens, data_s, d.unigram_entropy);
  JobContext ctx;
  const uint64_t seed = c.train.seed;
  ctx.fill_batch = [loader, seed](int kind, int64_t index, int B, int T, int32_t* in, int32_t* tg) {
    if (kind == 0)
      loader->get_train_batch(seed, index, B, T, in, tg);
    else
      loader->get_val_batch(index, B, T, in, tg);
  };
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
  ctx.run_dir = run_dir;
  ctx.trace_path = trace_path_;
  ctx.checkpoint_dir = follower ? std::string("(process 0's checkpoint writer)") : ckpt_dir;
  ctx.resume = state;
  ctx.tokenizer_hash = std::to_string(d.tokenizer_hash);
  ctx.tokenizer_path = d.tokenizer_path;
  ctx.stop_signal = &g_stop_signal;
  ctx.launch = launch;
  ctx.job_secret = secret;
  if (follower) ctx.run_dir.clear();
  if (const char* f = std::getenv("TROUPE_FAULT_KILL_IN_SNAPSHOT"); f && restart == 0)
    ctx.fault_kill_in_snapshot = std::atoll(f);
  if (c.checkpoint.memory_interval > 0 && launch.world > 1 && !in_place && !follower)
    spdlog::warn("checkpoint.memory_interval = {} has no effect here: only an in-place recovery (fault.policy = "
                 "restart under troupe launch --respawn process) reads memory snapshots; set it to 0 to save their cost",
                 c.checkpoint.memory_interval);
  ctx.memory = std::make_shared<MemoryStore>();
  ctx.recovering = in_place && restart > 0;
  ctx.generation = restart;
  if (const char* ft = std::getenv("TROUPE_FAILURE_TIME"); ft && restart > 0) ctx.failure_time = std::atof(ft);
  ctx.recovery_ckpt_dir = ckpt_dir;
  if (ctx.recovering && !follower)
    spdlog::warn("process {} started again (restart {} of at most {}, fault.policy = restart): the job continues from "
                 "the newest complete snapshot the processes hold, in memory or on disk",
                 launch.rank, restart, c.fault.max_restarts);
  else if (restart > 0 && !follower)
    spdlog::warn("restart {} of at most {} (fault.policy = restart): {}", restart, c.fault.max_restarts,
                 state ? fmt::format("continuing from {} (step {}); the failed start's steps after it are repeated "
                                     "(metrics.jsonl marks the resume)",
                                     state->dir, state->step)
                       : std::string("no snapshot yet: starting from step 1"));
  install_stop_signals();
  JobResult r;
  for (int generation = restart;;) {
    try {
      r = run_job(c, ctx);
      break;
    } catch (const UserError&) {
      throw;
    } catch (const std::exception& e) {
      if (file_log_) file_log_->error("error: {}", e.what());  // the failure is in train.log too
      if (in_place) {  // this process survived: it joins the others again and continues
        ++generation;
        if (generation > c.fault.max_restarts) {
          const auto snaps = ckpt_dir.empty() ? std::vector<std::pair<int64_t, std::string>>() : list_snapshots(ckpt_dir);
          throw FinalError(fmt::format(
              "{}\nthe job failed {} time(s), more than fault.max_restarts = {}: stopping for good. {}", e.what(),
              generation, c.fault.max_restarts,
              snaps.empty() ? std::string("No snapshot is on disk")
                            : fmt::format("The newest snapshot on disk is {} (step {}); continue with --resume latest "
                                          "once the cause is fixed",
                                          snaps.back().second, snaps.back().first)));
        }
        spdlog::warn("{}\n(fault.policy = restart: recovering in place, restart {} of at most {}; waiting for every "
                     "process to join again)",
                     e.what(), generation, c.fault.max_restarts);
        ctx.recovering = true;
        ctx.generation = generation;
        ctx.failure_time = failure_noticed_at() > 0 ? failure_noticed_at() : unix_seconds();
        ctx.resume = nullptr;
        ctx.fault_kill_in_snapshot = -1;
        continue;
      }
      if (launch.world > 1 && c.fault.policy == "restart") {
        print_error(log_prefix_ + e.what() +
                    "\n(fault.policy = restart: exit status 75 asks the launcher to start the job again)");
        return 75;
      }
      throw;
    }
  }
  if (r.follower) return 0;  // process 0 reports the job
  if (r.stopped_by_signal) {
    const auto& snaps = r.snapshots;
    if (snaps.empty() || !snaps.back().ok)
      throw Error("stopped by a signal after step " + std::to_string(r.last_step) +
                  " but its snapshot could not be written" +
                  (snaps.empty() ? std::string() : ": " + snaps.back().error) +
                  "; the work since the previous snapshot is lost");
    spdlog::info("stopped by a signal after step {}; {}", r.last_step,
                 !snaps.empty() && snaps.back().ok ? "snapshot " + snaps.back().dir + "; continue with --resume latest"
                                                   : std::string("no snapshot could be written"));
    return 0;
  }
  spdlog::info("done: {} steps, final val loss {:.4f} (unigram entropy {:.4f}, {:+.4f} nats), {:.0f} tokens/s", c.train.steps,
               r.final_val_loss, d.unigram_entropy, r.final_val_loss - d.unigram_entropy, r.tokens_per_s);
  return 0;
}

// troupe export DIR --format safetensors OUT
int cmd_export(const std::string& dir, const std::string& format, const std::string& out) {
  TROUPE_USER_CHECK(format == "safetensors") << "--format " << format << " is not supported; use --format safetensors";
  Config c = snapshot_config(dir);
  TrainState st = load_snapshot(dir, c);
  const fs::path parent = fs::absolute(out).parent_path();
  TROUPE_USER_CHECK(fs::is_directory(parent)) << "cannot write " << out << ": " << parent.string()
                                              << " is not a directory; pass a writable output path";
  setup_logging("");
  const uint64_t bytes = export_safetensors(st, c, out);
  spdlog::info("exported step {} of {} ({} layers, n_embd {}, vocab {}) to {} ({:.1f} MiB, safetensors, GPT-2 names)",
               st.step, dir, c.model.n_layer, c.model.n_embd, c.model.vocab_size, out, bytes / 1048576.0);
  return 0;
}

struct GenerateOptions {
  std::string dir, prompt, logits_out;
  int tokens = 64, top_k = 40;
  double temperature = 0.8;
  uint64_t seed = 1;
};

// troupe generate DIR --prompt "..." [--tokens N --temperature T --top-k K --seed S]
int cmd_generate(const GenerateOptions& o) {
  TROUPE_USER_CHECK(o.tokens >= 1) << "--tokens " << o.tokens << " must be at least 1";
  TROUPE_USER_CHECK(o.temperature >= 0) << "--temperature " << o.temperature << " must be >= 0 (0 = greedy)";
  TROUPE_USER_CHECK(o.top_k >= 0) << "--top-k " << o.top_k << " must be >= 0 (0 = all tokens)";
  Config c = snapshot_config(o.dir);
  auto st = std::make_shared<TrainState>(load_snapshot(o.dir, c));
  // one worker holds the whole model
  c.parallel.pp = c.parallel.tp = c.parallel.dp = c.parallel.microbatches = c.parallel.chunks = 1;
  c.parallel.schedule = "1f1b";
  c.parallel.sequence_parallel = false;
  c.train.sample_tokens = o.tokens;
  c.train.threads = 0;
  // inference computes in fp32 on the model's weights (a bf16/fp16 run's weights are
  // already values of that type): the logits match the exported model run in fp32
  c.train.precision = "fp32";
  setup_logging("");
  // the snapshot's own copy of the tokenizer; older snapshots: the run's data cache
  std::string tok_path = o.dir + "/tokenizer.model";
  if (!fs::exists(tok_path)) tok_path = prepare(c).tokenizer_path;
  auto tok = std::make_shared<Tokenizer>(Tokenizer::load(tok_path));
  TROUPE_USER_CHECK(st->tokenizer_hash.empty() || st->tokenizer_hash == std::to_string(tok->hash()))
      << "snapshot " << o.dir << " was trained with another tokenizer than " << tok_path << " (hash "
      << st->tokenizer_hash << " vs " << tok->hash() << "); keep the run's corpus and data.cache_dir";
  JobContext ctx;
  ctx.quiet = true;
  ctx.resume = st;
  ctx.generate_only = true;
  ctx.prompt = {tok->eot_id()};
  for (int32_t id : tok->encode(o.prompt)) ctx.prompt.push_back(id);
  ctx.temperature = o.temperature;
  ctx.top_k = o.top_k;
  ctx.sample_seed = o.seed;
  ctx.decode = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids); };
  ctx.fill_batch = [](int, int64_t, int B, int T, int32_t* in, int32_t* tg) {
    std::fill(in, in + (size_t)B * T, 0);
    std::fill(tg, tg + (size_t)B * T, 0);
  };
  JobResult r = run_job(c, ctx);
  if (!o.logits_out.empty()) {
    nlohmann::json j = {{"prompt_ids", ctx.prompt}, {"logits", r.prompt_logits}};
    std::ofstream(o.logits_out) << j.dump() << "\n";
  }
  std::cout << o.prompt << r.sample << std::endl;
  return 0;
}

struct SimulateOptions {
  std::string schedule = "1f1b", cost = "", trace, dump, config;
  int P = 4, M = 8, V = 1;
  bool quiet = false;
};

int cmd_simulate(SimulateOptions o, bool p_set, bool m_set, bool v_set) {
  const bool builtin = o.schedule == "gpipe" || o.schedule == "1f1b" || o.schedule == "interleaved" || o.schedule == "zb-h1";
  if (!builtin) {  // a schedule file: P, M and V come from it unless given
    Schedule f = read_schedule(o.schedule);
    if (!p_set) o.P = f.P;
    if (!m_set) o.M = f.M;
    if (!v_set) o.V = f.V;
  }
  Schedule s = make_schedule(o.schedule, o.P, o.M, o.V);
  validate_schedule(s);
  if (!o.dump.empty()) {
    std::string text = format_schedule(s);
    if (o.dump == "-") {
      std::cout << text;
    } else {
      std::ofstream out(o.dump + ".tmp");
      out << text;
      TROUPE_USER_CHECK(out.good()) << "cannot write " << o.dump << "; choose a writable --dump path";
      out.close();
      fs::rename(o.dump + ".tmp", o.dump);
      std::cout << "wrote " << o.dump << " (" << s.name << ", P=" << s.P << ", M=" << s.M << ", V=" << s.V << ")\n";
    }
    return 0;
  }
  Costs c = parse_costs(o.cost);
  SimResult r = simulate(s, c);
  // activation bytes for a model config (the default one unless --config)
  Config cfg = o.config.empty() ? Config{} : Config::load(o.config);
  GPTConfig g = GPTConfig::from(cfg.model);
  const int mbB = std::max(1, cfg.train.batch_size / std::max(1, o.M));
  const double per_layer = activation_bytes_per_layer(mbB, cfg.train.seq_len, g.C, g.NH);
  std::vector<int> bounds;
  if (s.P * s.V <= g.L) bounds = partition_layers(g, s.P * s.V);
  std::printf("schedule %s: P=%d stages, M=%d microbatches, V=%d chunk(s); costs f=%g b=%g w=%g p2p=%g%s\n",
              s.name.c_str(), s.P, s.M, s.V, c.f, c.b, c.w, c.p2p, s.split_backward ? " (B = b-w, W = w)" : "");
  std::printf("makespan %.6g time units; bubble overall %.6g\n", r.makespan, r.bubble_overall);
  std::printf("%-6s %10s %10s %14s %16s\n", "stage", "busy", "bubble", "peak in-flight", "peak act. bytes");
  for (int st = 0; st < s.P; ++st) {
    double layers = 0;
    if (!bounds.empty())
      for (int ch = 0; ch < s.V; ++ch) layers += bounds[ch * s.P + st + 1] - bounds[ch * s.P + st];
    const double bytes = r.peak_inflight[st] * (layers / s.V) * per_layer;
    std::printf("%-6d %10.6g %10.6g %14d %16.0f\n", st, r.busy[st], r.bubble[st], r.peak_inflight[st], bytes);
  }
  std::printf("(activation bytes for %d layers, n_embd %d, %d heads, %d sequences x %d tokens per microbatch%s)\n", g.L,
              g.C, g.NH, mbB, cfg.train.seq_len, o.config.empty() ? ", the default model; --config to change" : "");
  if (!o.quiet) std::cout << ascii_timeline(s, r);
  if (!o.trace.empty()) {
    std::ofstream out(o.trace);
    out << chrome_trace(s, r);
    TROUPE_USER_CHECK(out.good()) << "cannot write " << o.trace << "; choose a writable --trace path";
    std::printf("wrote %s (open in chrome://tracing or ui.perfetto.dev)\n", o.trace.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupe: GPT training with pipeline-stage actors"};
  app.require_subcommand(1);
  std::string config_path, run_dir;
  std::vector<std::string> sets;
  auto* train = app.add_subcommand("train", "train a model (the main job)");
  train->add_option("--config", config_path, "TOML config file")->required();
  train->add_option("--set", sets, "override a key: section.key=value (repeatable)");
  train->add_option("--run-dir", run_dir, "run directory (default runs/<timestamp>)");
  std::string resume;
  train->add_option("--resume", resume, "continue from a snapshot: its directory, or 'latest' (newest valid in checkpoint.dir)");
  auto* tokenize = app.add_subcommand("tokenize", "prepare the corpus: tokenizer + token files");
  tokenize->add_option("--config", config_path, "TOML config file")->required();
  tokenize->add_option("--set", sets, "override a key: section.key=value (repeatable)");
  SimulateOptions so;
  auto* simulate_cmd = app.add_subcommand("simulate", "simulate a pipeline schedule: bubble, memory, timeline, trace");
  simulate_cmd->add_option("--schedule", so.schedule, "gpipe | 1f1b | interleaved | zb-h1 | FILE (default 1f1b)");
  simulate_cmd->add_option("--stages", so.P, "pipeline stages P (default 4)");
  simulate_cmd->add_option("--microbatches", so.M, "microbatches M (default 8)");
  simulate_cmd->add_option("--chunks", so.V, "virtual chunks per stage V (default 1)");
  simulate_cmd->add_option("--cost", so.cost, "f=1,b=2,w=1,p2p=0 (b = full backward, w = its weight part)");
  simulate_cmd->add_option("--trace", so.trace, "write a Chrome trace JSON");
  simulate_cmd->add_option("--dump", so.dump, "write the schedule as an editable text file ('-' = stdout) and exit");
  simulate_cmd->add_option("--config", so.config, "model config for activation bytes");
  simulate_cmd->add_flag("--quiet", so.quiet, "no ASCII timeline");
  std::string export_dir, export_format = "safetensors", export_out;
  auto* export_cmd = app.add_subcommand("export", "write a snapshot's model as safetensors (GPT-2 Hugging Face names)");
  export_cmd->add_option("snapshot", export_dir, "snapshot directory (checkpoint.dir/step-<k>)")->required();
  export_cmd->add_option("--format", export_format, "safetensors (the only format)");
  export_cmd->add_option("out", export_out, "output file, e.g. model.safetensors")->required();
  GenerateOptions go;
  auto* generate_cmd = app.add_subcommand("generate", "sample text from a snapshot");
  generate_cmd->add_option("snapshot", go.dir, "snapshot directory (checkpoint.dir/step-<k>)")->required();
  generate_cmd->add_option("--prompt", go.prompt, "text to continue (default: a new document)");
  generate_cmd->add_option("--tokens", go.tokens, "tokens to generate (default 64)");
  generate_cmd->add_option("--temperature", go.temperature, "softmax temperature, 0 = greedy (default 0.8)");
  generate_cmd->add_option("--top-k", go.top_k, "sample among the k most likely tokens, 0 = all (default 40)");
  generate_cmd->add_option("--seed", go.seed, "sampling seed (default 1)");
  generate_cmd->add_option("--logits-out", go.logits_out, "write the prompt's next-token logits as JSON (checks)");
  train->add_option("--trace", trace_path_, "write a Chrome trace of measured spans; print measured vs simulated bubble");
  if (argc > 1 && argv[1][0] != '-') {
    const std::string cmd = argv[1];
    if (cmd == "launch") return troupe::launch_main(argc - 2, argv + 2);
    if (cmd != "train" && cmd != "tokenize" && cmd != "simulate" && cmd != "export" && cmd != "generate") {
      std::cerr << "error: unknown command '" << cmd
                << "'; use train, tokenize, simulate, export or generate (see troupe --help)" << std::endl;
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    for (auto& ch : msg)
      if (ch == '\n') ch = ' ';
    std::cerr << "error: " << msg << "; see troupe --help" << std::endl;
    return 2;
  }
  try {
    if (simulate_cmd->parsed())
      return cmd_simulate(so, simulate_cmd->get_option("--stages")->count() > 0,
                          simulate_cmd->get_option("--microbatches")->count() > 0,
                          simulate_cmd->get_option("--chunks")->count() > 0);
    if (export_cmd->parsed()) return cmd_export(export_dir, export_format, export_out);
    if (generate_cmd->parsed()) return cmd_generate(go);
    Config c = load_config(config_path, sets);
    if (train->parsed()) return cmd_train(c, run_dir, resume);
    if (tokenize->parsed()) return cmd_tokenize(c);
  } catch (const UserError& e) {
    print_error(log_prefix_ + e.what());
    return 2;
  } catch (const std::exception& e) {
    print_error(log_prefix_ + e.what());
    return 1;
  }
  return 1;
}
