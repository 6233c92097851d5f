// cli/tools.cpp — troupe export, generate and simulate.
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

#include <cstring>

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
#include "core/text.h"
#include "datasets/corpus.h"
#include "datasets/loader.h"
#include "datasets/prepare.h"
#include "datasets/tokenizer.h"
#include "model/gpt.h"
#include "stages/schedule.h"
#include "stages/simulator.h"
#include "stages/stage.h"
#include "cli/common.h"
#include "cli/train_checks.h"
#include "core/peak.h"
#include "cli/figures.h"

namespace fs = std::filesystem;

namespace troupe::cli {

namespace {
// A snapshot directory given to export or generate: refused (UserError naming the fix)
// when it is missing, not a folder, or not one complete snapshot.
void check_snapshot_arg(const std::string& dir) {
  std::error_code ec;
  TROUPE_USER_CHECK(fs::exists(dir, ec)) << "snapshot directory " << dir << " " << missing_reason(dir)
                                         << " pass a snapshot of a run, e.g. "
                                            "runs/<run>/checkpoints/step-<k> (checkpoint.dir/step-<k>)";
  // a live run's checkpoint.keep_last deletes a snapshot's manifest, then its files, then the
  // folder: a step-<k> folder seen without its manifest may be one about to vanish (waited
  // for up to a second before it is called incomplete or empty)
  if (!fs::is_directory(dir, ec)) refuse_if_snapshot_removed(dir);
  TROUPE_USER_CHECK(fs::is_directory(dir, ec)) << dir << " is not a directory; pass a snapshot directory, e.g. "
                                                  "runs/<run>/checkpoints/step-<k>";
  check_snapshot_readable(dir);
  if (fs::is_regular_file(fs::path(dir) / "manifest.capnp", ec)) return;
  if (named_like_snapshot(dir)) refuse_if_snapshot_removed(dir, 1.0);
  TROUPE_USER_CHECK(!fs::exists(fs::path(dir) / "manifest.capnp", ec))
      << dir << "/manifest.capnp is not a regular file, so " << dir
      << " is not a snapshot troupe wrote; pass a finished one, e.g. runs/<run>/checkpoints/step-<k>";
  const auto snaps = list_snapshots(dir);
  TROUPE_USER_CHECK(snaps.empty()) << dir << " holds snapshots, it is not one; pass one of them, e.g. "
                                   << snaps.back().second << " (the newest)";
  TROUPE_USER_CHECK(!fs::is_empty(dir, ec)) << "snapshot directory " << dir
                                            << " is empty; pass a snapshot of a run, e.g. runs/<run>/checkpoints/step-<k>";
  if (fs::exists(fs::path(dir) / "metrics.jsonl", ec) || fs::exists(fs::path(dir) / "config.toml", ec)) {  // a run directory
    const std::string ck = (fs::path(dir) / "checkpoints").string();
    const auto in_run = fs::is_directory(ck, ec) ? list_snapshots(ck) : decltype(list_snapshots(ck))();
    TROUPE_USER_CHECK(in_run.empty()) << dir << " is a run directory, not a snapshot; pass one of its snapshots, e.g. "
                                      << in_run.back().second << " (the newest)";
    TROUPE_USER_FAIL() << dir << " is a run directory, not a snapshot, and " << ck
                       << " holds none (its run saved none there, or checkpoint.dir pointed elsewhere: see its "
                          "config.toml); pass a snapshot, e.g. <checkpoint.dir>/step-<k>";
  }
  TROUPE_USER_FAIL() << dir << " has no manifest.capnp: it is not a complete snapshot (a save that was interrupted, or "
                     << "another folder); pass a finished one, e.g. runs/<run>/checkpoints/step-<k>";
}

// An output of a command that reads the snapshot `dir` (trained with config c) is none of
// the run's own files: its corpus and tokenizer (the snapshot's config names them), its
// metrics and log beside the checkpoints folder, its data cache, its data sources.
void refuse_run_files(const std::string& out, const std::string& option, const std::string& dir, const Config& c) {
  if (out.empty()) return;
  const fs::path run = fs::path(dir).parent_path().parent_path();
  std::vector<std::string> files = {c.data.corpus, c.data.tokenizer, (run / "metrics.jsonl").string(),
                                    (run / "train.log").string(), (run / "config.toml").string()};
  std::vector<std::string> dirs = {c.data.cache_dir};
  for (const DataSource& src : c.data.sources) dirs.push_back(src.path);
  refuse_overwriting(out, option, files, dirs);
}
}  // namespace

// troupe export DIR --format safetensors OUT
int cmd_export(const std::string& dir, const std::string& format, const std::string& out) {
  TROUPE_USER_CHECK(format == "safetensors") << "--format '" << format << "' is not supported; use --format safetensors";
  check_snapshot_arg(dir);
  refuse_overwriting(out, "output", {}, {dir});
  Config c = snapshot_config(dir);
  refuse_run_files(out, "output", dir, c);
  // the file holds every parameter in fp32 (the tied head once) and a small JSON header
  check_output_file(out, "output", 4 * (uint64_t)GPTConfig::from(c.model).n_params() + (1u << 20));
  check_address_space(16 * (uint64_t)GPTConfig::from(c.model).n_params(), "export");
  TrainState st = load_snapshot(dir, c);
  setup_logging("");
  const uint64_t bytes = export_safetensors(st, c, out);
  spdlog::info("exported step {} of {} ({} layers, n_embd {}, vocab {}) to {} ({:.1f} MiB, safetensors, GPT-2 names)",
               st.step, dir, c.model.n_layer, c.model.n_embd, c.model.vocab_size, out, bytes / 1048576.0);
  return 0;
}


namespace {
// Prints a generation as it is drawn: each token's bytes go through a Utf8Stream, so every
// complete character is printed at once, an invalid byte shows as U+FFFD (as train's
// sample does) and no control byte but newline and tab reaches the terminal. Each token
// costs the same whatever came before.
struct TextStream {
  const Tokenizer* tok;
  Utf8Stream utf8;
  void push(int32_t id) {
    const int32_t one[1] = {id};
    const std::string text = utf8.push(tok->decode(one));
    errno = 0;
    if (!text.empty()) std::cout << text << std::flush;
    const int err = errno;  // (the failed write(2)'s, when the stream failed)
    // a reader that went away (generate | head): stop drawing, quietly (SIGPIPE is ignored, cli/main.cpp)
    if (!std::cout.good() && stdout_reader_gone()) throw StdoutReaderGone();
    TROUPE_USER_CHECK(std::cout.good()) << "cannot write to standard output (" << stdout_write_failure(err)
                                        << "); the generation stopped there";
  }
  void finish() { std::cout << utf8.finish() << std::endl; }
};
}  // namespace

// troupe generate DIR --prompt "..." [--tokens N --temperature T --top-k K --seed S]
int cmd_generate(const GenerateOptions& o) {
  // (its one process would read the launcher's TROUPE_LOCAL_WORLD_SIZE as a job of several)
  TROUPE_USER_CHECK(!std::getenv("TROUPE_LAUNCH_ID"))
      << "troupe generate runs in one process, not under troupe launch (which starts the processes of one training "
         "job, troupe train): run it by itself";
  TROUPE_USER_CHECK(o.tokens >= 1 && o.tokens <= kMaxSampleTokens)
      << "--tokens " << o.tokens << " is out of range; use 1 to " << kMaxSampleTokens;
  TROUPE_USER_CHECK(o.temperature >= 0 && std::isfinite(o.temperature))
      << "--temperature " << o.temperature << " must be a finite number >= 0 (0 = greedy)";
  TROUPE_USER_CHECK(o.top_k >= 0) << "--top-k " << o.top_k << " must be >= 0 (0 = all tokens)";
  TROUPE_USER_CHECK(o.seed >= 0) << "--seed " << o.seed << " must be a whole number >= 0";
  if (const size_t bad = find_invalid_utf8(o.prompt); bad != std::string_view::npos)
    TROUPE_USER_FAIL() << "--prompt is not valid UTF-8 (at byte offset " << bad
                       << fmt::format(", byte 0x{:02x}", (unsigned)(unsigned char)o.prompt[bad])
                       << "); pass UTF-8 text (e.g. iconv -t UTF-8)";
  TROUPE_USER_CHECK(o.prompt.size() <= (1u << 20)) << "--prompt has " << o.prompt.size()
                                                   << " bytes; use at most 1 MiB (the model sees its last block_size tokens)";
  check_snapshot_arg(o.dir);
  check_cgroup_tasks(usable_cores() + 8, "run it where more threads may start");  // (OpenMP's team, and its own)
  refuse_overwriting(o.logits_out, "--logits-out", {}, {o.dir});
  Config c = snapshot_config(o.dir);
  refuse_run_files(o.logits_out, "--logits-out", o.dir, c);  // (its corpus was replaced: fresh-user check 5)
  // the JSON holds vocab_size logits of up to ~16 characters each: refused before any text
  if (!o.logits_out.empty()) check_output_file(o.logits_out, "--logits-out", 16 * (uint64_t)c.model.vocab_size + 4096);
  check_address_space(24 * (uint64_t)GPTConfig::from(c.model).n_params(), "generate");
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
  // the snapshot's own copy of the tokenizer, read with it; older snapshots (whose manifest
  // lists none): the run's data cache
  std::string tok_path = o.dir + "/tokenizer.model";
  if (st->tokenizer_model.empty()) tok_path = prepare(c).tokenizer_path;
  auto tok = std::make_shared<Tokenizer>(st->tokenizer_model.empty() ? Tokenizer::load(tok_path)
                                                                     : Tokenizer::from_bytes(st->tokenizer_model, tok_path));
  TROUPE_USER_CHECK(st->tokenizer_hash.empty() || st->tokenizer_hash == std::to_string(tok->hash()))
      << "snapshot " << o.dir << " was trained with another tokenizer than " << tok_path << " (hash "
      << st->tokenizer_hash << " vs " << tok->hash() << "); keep the run's corpus and data.cache_dir";
  JobContext ctx;
  ctx.quiet = true;
  ctx.resume = st;
  ctx.generate_only = true;
  ctx.prompt = {tok->eot_id()};
  for (int32_t id : tok->encode(o.prompt)) ctx.prompt.push_back(id);
  // the model attends to its last block_size tokens only: said, not left to be guessed
  if ((int64_t)ctx.prompt.size() > c.model.block_size)
    std::cerr << "note: the prompt is " << ctx.prompt.size() << " tokens (with the start token) and the model sees its "
              << "last " << c.model.block_size << " (model.block_size): the start of the prompt is left out" << std::endl;
  ctx.temperature = o.temperature;
  ctx.top_k = o.top_k;
  ctx.sample_seed = (uint64_t)o.seed;
  ctx.decode = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids); };
  // the continuation is printed token by token, after the prompt
  auto stream = std::make_shared<TextStream>(TextStream{tok.get(), Utf8Stream{}});
  {
    Utf8Stream shown;  // the prompt is valid UTF-8 (checked above) but may hold control bytes
    std::cout << shown.push(o.prompt) << shown.finish() << std::flush;
  }
  ctx.on_token = [stream](int32_t id) { stream->push(id); };
  ctx.fill_batch = [](int, int64_t, int B, int T, int32_t* in, int32_t* tg) {
    std::fill(in, in + (size_t)B * T, 0);
    std::fill(tg, tg + (size_t)B * T, 0);
  };
  JobResult r = run_job(c, ctx);
  stream->finish();
  if (!o.logits_out.empty()) {
    nlohmann::json j = {{"prompt_ids", ctx.prompt}, {"logits", r.prompt_logits}};
    write_output_file(o.logits_out, j.dump() + "\n", "--logits-out");
  }
  return 0;
}


int cmd_simulate(SimulateOptions o, bool p_set, bool m_set, bool v_set, bool schedule_set) {
  // --config: its [parallel] layout (schedule, pp, microbatches, chunks) unless a flag sets
  // one, so the activation bytes are those of the layout the config trains (fresh-user
  // check 4: the defaults P=4, M=8 were simulated beside tiny.toml's pp = 2, M = 4)
  // the config is read once: its layout, its inputs (not to be overwritten), its model
  const Config cfg = o.config.empty() ? Config{} : Config::load(o.config);
  std::string from_config;
  const auto took = [&](const char* what) { from_config += std::string(from_config.empty() ? "" : ", ") + what; };
  if (!o.config.empty()) {
    if (!schedule_set) o.schedule = cfg.parallel.schedule, took("schedule");
    if (builtin_schedule(o.schedule)) {  // (a schedule file brings its own P, M and V)
      if (!p_set) o.P = cfg.parallel.pp, took("stages");
      if (!m_set) o.M = cfg.parallel.microbatches, took("microbatches");
      if (!v_set && o.schedule == "interleaved") o.V = cfg.parallel.chunks, took("chunks");
    }
  }
  const bool builtin = builtin_schedule(o.schedule);
  // a name that is no path (2f2b): a misspelled built-in, not a missing file (fresh-user check, session 22)
  TROUPE_USER_CHECK(builtin || o.schedule.find('/') != std::string::npos || o.schedule.find('.') != std::string::npos ||
                    std::filesystem::exists(o.schedule))
      << "unknown schedule '" << printable(o.schedule, false, 80)
      << "'; use gpipe, 1f1b, interleaved, zb-h1 or a path to a schedule file (e.g. ./" << printable(o.schedule, false, 80)
      << ")";
  if (!builtin) {  // a schedule file: P, M and V come from it unless given
    Schedule f = read_schedule(o.schedule);
    TROUPE_USER_CHECK(!p_set || o.P == f.P) << "schedule file " << o.schedule << " has " << f.P
                                            << " rows (stages) but --stages " << o.P << "; drop --stages";
    TROUPE_USER_CHECK(!m_set || o.M == f.M) << "schedule file " << o.schedule << " uses " << f.M
                                            << " microbatches but --microbatches " << o.M << "; drop --microbatches";
    TROUPE_USER_CHECK(!v_set || o.V == f.V) << "schedule file " << o.schedule << " uses " << f.V
                                            << " chunks but --chunks " << o.V << "; drop --chunks";
    o.P = f.P;
    o.M = f.M;
    o.V = f.V;
  }
  // the flags' own names (make_schedule names the config keys of a training run)
  TROUPE_USER_CHECK(!builtin || o.schedule == "interleaved" || o.V == 1)
      << "--schedule " << o.schedule << " runs one chunk per stage; drop --chunks " << o.V
      << " or use --schedule interleaved";
  // its errors name the flags, whose fixes work as flags override the config; the counts
  // the config gave are said to come from it (trial 63, F9)
  Schedule s;
  try {
    s = make_schedule(o.schedule, o.P, o.M, o.V, ScheduleNames::flags());
  } catch (const UserError& e) {
    if (from_config.empty()) throw;
    throw UserError(std::string(e.what()) + " (" + from_config + " from " + o.config +
                    "'s [parallel]; the flags override them)");
  }
  validate_schedule(s);
  // --dump writes the schedule and ends before the simulation: a trace or a picture asked for
  // beside it would be dropped without a word
  TROUPE_USER_CHECK(o.dump.empty() || (o.trace.empty() && o.png.empty()))
      << "--dump writes the schedule and exits before simulating, so " << (o.trace.empty() ? "--png" : "--trace")
      << " would write nothing; run simulate twice: once with --dump, once with --trace/--png";
  refuse_same_outputs({{o.dump, "--dump"}, {o.trace, "--trace"}, {o.png, "--png"}});
  // the config's own inputs too: its corpus, tokenizer, data sources and folders (trial 50, M5)
  std::vector<std::string> inputs = {builtin ? std::string() : o.schedule, o.config}, folders;
  if (!o.config.empty()) {
    // (its schedule file too, when --schedule overrides it: trial 64, F2)
    inputs.insert(inputs.end(), {cfg.data.corpus, cfg.data.tokenizer,
                                 builtin_schedule(cfg.parallel.schedule) ? std::string() : cfg.parallel.schedule});
    folders = {cfg.data.cache_dir, cfg.checkpoint.dir};
    for (const DataSource& src : cfg.data.sources) folders.push_back(src.path);
  }
  for (auto [out, flag] : {std::pair{o.dump, "--dump"}, {o.trace, "--trace"}, {o.png, "--png"}})
    refuse_overwriting(out, flag, inputs, folders);
  if (!o.dump.empty() && o.dump != "-") check_output_file(o.dump, "--dump");
  if (!o.trace.empty()) check_output_file(o.trace, "--trace");
  if (!o.png.empty()) check_png_output(o.png, "--png");  // refused before the report is printed
  if (!o.dump.empty()) {
    std::string text = format_schedule(s);
    if (o.dump == "-") {
      std::cout << text;
    } else {
      write_output_file(o.dump, text, "--dump");
      std::cout << "wrote " << o.dump << " (" << s.name << ", P=" << s.P << ", M=" << s.M << ", V=" << s.V << ")\n";
    }
    return 0;
  }
  Costs c = parse_costs(o.cost);
  SimResult r = simulate(s, c);
  // activation bytes for a model config (the default one unless --config)
  GPTConfig g = GPTConfig::from(cfg.model);
  const int mbB = std::max(1, cfg.train.batch_size / std::max(1, o.M));
  const double per_layer = activation_bytes_per_layer(mbB, cfg.train.seq_len, g.C, g.NH);
  // every chunk needs a layer: a model of fewer layers has no activations to report
  // (each count named where it came from: a flag, the config or the schedule file; trial 62, L10)
  const auto from = [&](bool flag, const char* flag_name, bool config_gave, const char* key) -> std::string {
    return flag ? flag_name : !builtin ? "the schedule file" : config_gave ? key : "the default";
  };
  const bool cfg_p = !o.config.empty(), cfg_v = cfg_p && o.schedule == "interleaved";
  TROUPE_USER_CHECK(o.config.empty() || s.P * s.V <= g.L)
      << s.P << " stages (" << from(p_set, "--stages", cfg_p, "parallel.pp") << ") x " << s.V << " chunk(s) ("
      << from(v_set, "--chunks", cfg_v, "parallel.chunks") << ") = " << s.P * s.V << " model chunks, but model.n_layer = "
      << g.L << " in " << o.config << ": every chunk needs at least one layer; use stages x chunks <= " << g.L
      << ", or leave out --config";
  std::vector<int> bounds;
  if (s.P * s.V <= g.L) bounds = partition_layers(g, s.P * s.V);
  // the costs as typed (number_text: 1e12, not 1e+12; trial 62, L9)
  const std::string costs = "f=" + detail::number_text(c.f) + " b=" + detail::number_text(c.b) +
                            " w=" + detail::number_text(c.w) + " p2p=" + detail::number_text(c.p2p);
  std::printf("schedule %s: P=%d stages, M=%d microbatches, V=%d chunk(s); costs %s%s\n", s.name.c_str(), s.P, s.M, s.V,
              costs.c_str(), s.split_backward ? " (B = b-w, W = w)" : "");
  if (!from_config.empty())
    std::printf("(%s from %s's [parallel]; the flags override them)\n", from_config.c_str(),
                printable(o.config, false, 200).c_str());
  std::printf("makespan %.6g time units; bubble overall %.6g\n", r.makespan, r.bubble_overall);
  if (const std::string d = p2p_order_disagreement(s); d.empty())
    std::printf("p2p order: every pair of neighbouring stages agrees (an in-order transport such as NCCL can run it)\n");
  else
    std::printf("p2p order: %s (the CPU data plane matches messages by microbatch and chunk and runs it; an "
                "in-order transport such as NCCL could not)\n", printable(d, false).c_str());
  std::printf("%-6s %10s %10s %14s %16s\n", "stage", "busy", "bubble", "peak in-flight", "peak act. bytes");
  for (int st = 0; st < s.P; ++st) {
    double layers = 0;
    if (!bounds.empty())
      for (int ch = 0; ch < s.V; ++ch) layers += bounds[ch * s.P + st + 1] - bounds[ch * s.P + st];
    const double bytes = r.peak_inflight[st] * (layers / s.V) * per_layer;
    std::printf("%-6d %10.6g %10.6g %14d %16s\n", st, r.busy[st], r.bubble[st], r.peak_inflight[st],
                bounds.empty() ? "n/a" : fmt::format("{:.0f}", bytes).c_str());
  }
  if (bounds.empty())
    std::printf("(no activation bytes: the default model's %d layers cannot fill %d x %d chunks; --config a model of "
                "at least %d layers)\n", g.L, s.P, s.V, s.P * s.V);
  else
    std::printf("(activation bytes for %d layers, n_embd %d, %d heads, %d sequences x %d tokens per microbatch%s)\n",
                g.L, g.C, g.NH, mbB, cfg.train.seq_len, o.config.empty() ? ", the default model; --config to change" : "");
  if (!o.quiet) std::cout << ascii_timeline(s, r);
  if (!o.png.empty()) {
    std::vector<TimelineBar> bars;
    for (auto& a : r.timeline) bars.push_back({a.stage, (char)a.action.kind, a.action.mb, a.action.chunk, a.start, a.end});
    draw_timeline(bars, s.P,
                  fmt::format("{}: P={} stages, M={} microbatches, V={}; costs {}; bubble {:.1f}%", s.name, s.P, s.M,
                              s.V, costs, 100 * r.bubble_overall),
                  "time units (simulated)", o.png, "--png");
    std::printf("wrote %s\n", o.png.c_str());
  }
  if (!o.trace.empty()) {
    write_output_file(o.trace, chrome_trace(s, r), "--trace");
    std::printf("wrote %s (open in chrome://tracing or ui.perfetto.dev)\n", o.trace.c_str());
  }
  return 0;
}

}  // namespace troupe::cli
