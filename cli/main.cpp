// troupe — the command line.
//   troupe train    --config FILE [--set section.key=value ...] [--run-dir DIR]
//   troupe tokenize --config FILE [--set ...]      corpus -> tokenizer + token files (cached)
// Exit codes: 0 success, 2 bad input (config, corpus, paths, layout), 1 any other failure.
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "actors/job.h"
#include "core/config.h"
#include "core/error.h"
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

// Creates the run directory (or uses an existing one) and proves it is writable.
std::string make_run_dir(std::string dir) {
  if (dir.empty()) {
    dir = "runs/" + timestamp();
    for (int i = 1; fs::exists(dir); ++i) dir = "runs/" + timestamp() + "-" + std::to_string(i);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  TROUPE_USER_CHECK(!ec && fs::is_directory(dir))
      << "cannot create run directory '" << dir << "' (" << (ec ? ec.message() : "not a directory")
      << "); pass --run-dir with a writable folder";
  TROUPE_USER_CHECK(::access(dir.c_str(), W_OK) == 0)
      << "run directory '" << dir << "' is not writable; pass --run-dir with a writable folder";
  return dir;
}

// Saves the resolved config as DIR/config.toml; never overwrites a different one.
void save_config(const Config& c, const std::string& dir) {
  std::string text = c.to_toml();
  std::string path = dir + "/config.toml";
  if (fs::exists(path)) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str() == text) return;
    path = dir + "/config-" + timestamp() + ".toml";
  }
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    TROUPE_USER_CHECK(out.good()) << "cannot write " << tmp << "; pass --run-dir with a writable folder";
  }
  fs::rename(tmp, path);
}

void setup_logging(const std::string& run_dir) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  std::vector<spdlog::sink_ptr> sinks{console};
  if (!run_dir.empty()) sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(run_dir + "/train.log"));
  auto logger = std::make_shared<spdlog::logger>("troupe", sinks.begin(), sinks.end());
  logger->set_pattern("[%H:%M:%S] %v");
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

int cmd_train(const Config& c, const std::string& run_dir_opt) {
  const std::string run_dir = make_run_dir(run_dir_opt);
  setup_logging(run_dir);
  save_config(c, run_dir);
  spdlog::info("run directory: {}", run_dir);
  auto t0 = std::chrono::steady_clock::now();
  auto d = prepare(c);
  auto loader = std::make_shared<BatchLoader>(d.train_path, d.val_path);
  // Token files are checked against the model before anything trains.
  for (const TokenFile* f : {&loader->train(), &loader->val()}) {
    f->check_tokenizer(d.tokenizer_hash);
    f->validate(c.model.vocab_size);
  }
  auto tok = std::make_shared<Tokenizer>(Tokenizer::load(d.tokenizer_path));
  TROUPE_USER_CHECK(tok->vocab_size() == c.model.vocab_size)
      << "the tokenizer " << d.tokenizer_path << " has " << tok->vocab_size() << " tokens but model.vocab_size = "
      << c.model.vocab_size << "; set model.vocab_size = " << tok->vocab_size() << " or use a matching data.tokenizer";
  spdlog::info("data: {} train tokens, {} val tokens ({:.1f} s); unigram entropy {:.4f} nats/token", d.train_tokens,
               d.val_tokens, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               d.unigram_entropy);
  JobContext ctx;
  const uint64_t seed = c.train.seed;
  ctx.fill_batch = [loader, seed](int kind, int64_t index, int B, int T, int32_t* in, int32_t* tg) {
    if (kind == 0)
      loader->get_train_batch(seed, index, B, T, in, tg);
    else
      loader->get_val_batch(index, B, T, in, tg);
  };
  ctx.decode = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids); };
  ctx.sample_start_token = d.eot_id;
  ctx.unigram_entropy = d.unigram_entropy;
  ctx.run_dir = run_dir;
  auto r = run_job(c, ctx);
  spdlog::info("done: {} steps, final val loss {:.4f} (unigram entropy {:.4f}, {:+.4f} nats), {:.0f} tokens/s", c.train.steps,
               r.final_val_loss, d.unigram_entropy, r.final_val_loss - d.unigram_entropy, r.tokens_per_s);
  return 0;
}

struct SimulateOptions {
  std::string schedule = "1f1b", cost = "", trace, dump, config;
  int P = 4, M = 8, V = 1;
  bool quiet = false;
};

int cmd_simulate(const SimulateOptions& o) {
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
  std::printf("makespan %.6g time units; bubble overall %.6f\n", r.makespan, r.bubble_overall);
  std::printf("%-6s %10s %10s %14s %16s\n", "stage", "busy", "bubble", "peak in-flight", "peak act. bytes");
  for (int st = 0; st < s.P; ++st) {
    double layers = 0;
    if (!bounds.empty())
      for (int ch = 0; ch < s.V; ++ch) layers += bounds[ch * s.P + st + 1] - bounds[ch * s.P + st];
    const double bytes = r.peak_inflight[st] * (layers / s.V) * per_layer;
    std::printf("%-6d %10.6g %10.6f %14d %16.0f\n", st, r.busy[st], r.bubble[st], r.peak_inflight[st], bytes);
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    if (simulate_cmd->parsed()) return cmd_simulate(so);
    Config c = load_config(config_path, sets);
    if (train->parsed()) return cmd_train(c, run_dir);
    if (tokenize->parsed()) return cmd_tokenize(c);
  } catch (const UserError& e) {
    std::fflush(stdout);
    std::cerr << "error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
  return 1;
}
