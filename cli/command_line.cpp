// cli/command_line.cpp — troupe's command line (cli/command_line.h): the commands and their
// options, the checks before CLI11 parses (a command first, launch and help), the checks of
// every value after, and the dispatch to the command. cli/main.cpp starts the process.
#include "cli/command_line.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>
#include <cctype>
#include <string>
#include <system_error>
#include <vector>

#include <CLI/CLI.hpp>

#include "actors/job.h"
#include "cli/common.h"
#include "cli/launch.h"
#include "cli/plan.h"
#include "core/paths.h"
#include "core/error.h"
#include "core/text.h"
#include "kernels/gemm_libs.h"
#include "stages/schedule.h"
#include "troupe_version.h"

namespace troupe::cli {
namespace {

// One sentence for a command line CLI11 refused. A value that is not of the option's type
// ("Could not convert: --tokens = 1e12") names the option, what it takes and its help
// text, which gives the range; the rest keep CLI11's words.
// CLI11 2.1 turns a whole number past its type's range into the largest value without a
// word ("--seed 99999999999999999999999" became 2^63 - 1): this check refuses it first.
const CLI::Validator kWholeNumberInRange(
    [](std::string& s) -> std::string {
      // decimal only: CLI11 reads 010 as octal 8 and 0x10 as 16 (trial 39), TOML refuses both
      const size_t digits = s.find_first_not_of("+-") == 1 ? 1 : 0;
      if (s.size() > digits + 1 && s[digits] == '0' && (s[digits + 1] == 'x' || s[digits + 1] == 'X' ||
                                                        s[digits + 1] == 'b' || s[digits + 1] == 'B' ||
                                                        s[digits + 1] == 'o' || s[digits + 1] == 'O'))
        return "'" + s.substr(0, 40) + "' is not a decimal number (0x, 0b and 0o numbers are not taken here): write "
               "it in decimal";
      if (s.size() > digits + 1 && s[digits] == '0' && std::isdigit((unsigned char)s[digits + 1]))
        return "'" + s.substr(0, 40) + "' has a leading zero (which some tools read as octal: 010 as 8): write it "
               "in decimal without leading zeros";
      errno = 0;
      char* end = nullptr;
      (void)std::strtoll(s.c_str(), &end, 0);
      return errno == ERANGE ? "'" + s.substr(0, 40) + "' is out of range: a whole number here is at most "
                                   "9223372036854775807 (2^63 - 1)"
                             : std::string();
    },
    "INT");

// A real number in decimal: strtod (CLI11's conversion) also takes hexadecimal floats (0x1p-1),
// which nobody means on a command line (trial 40).
const CLI::Validator kDecimalReal(
    [](std::string& s) -> std::string {
      if (s.find_first_of("xX") != std::string::npos) {
        // the decimal it means, when it reads as one (trial 62, L7: "e.g. 0.5" was then refused by --tokens)
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        const bool whole = end == s.c_str() + s.size() && std::isfinite(v);
        return "'" + s.substr(0, 40) + "' is not a decimal number (hexadecimal is not taken here): write it in "
               "decimal" + (whole ? ": " + troupe::detail::number_text(v) : std::string(", e.g. 1e9"));
      }
      // 1e309 would read as inf, and be refused as "inf" (trial 59, L2): named as typed
      errno = 0;
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (end != s.c_str() && errno == ERANGE && std::isinf(v))
        return "'" + s.substr(0, 40) + "' is beyond the largest number a double holds (about 1.8e308): write a "
               "smaller one";
      return std::string();
    },
    "NUMBER");

std::string str_upper(std::string s) {
  for (char& ch : s) ch = (char)std::toupper((unsigned char)ch);
  return s;
}

std::string parse_error_sentence(CLI::App& app, const CLI::ParseError& e) {
  std::string msg = e.what();
  for (auto& ch : msg)
    if (ch == '\n') ch = ' ';
  const std::string prefix = "Could not convert: ";
  const size_t eq = msg.find(" = ");
  if (dynamic_cast<const CLI::ConversionError*>(&e) && msg.rfind(prefix, 0) == 0 && eq != std::string::npos) {
    const std::string name = msg.substr(prefix.size(), eq - prefix.size());
    const std::string value = msg.substr(eq + 3);
    for (CLI::App* sub : app.get_subcommands()) {
      const CLI::Option* opt = sub->get_option_no_throw(name);
      if (!opt) continue;
      // the type name may carry a validator's text ("INT:INT in [1 - 100000]"): its head names the kind
      const std::string type = opt->get_type_name();
      const auto starts = [&](const char* t) { return type.rfind(t, 0) == 0; };
      const std::string kind = starts("INT") || starts("UINT") ? "a whole number in range"
                               : starts("FLOAT")               ? "a number"
                                                               : "a value of type " + type;
      return name + " of troupe " + sub->get_name() + " takes " + kind + ", not '" + value + "': " +
             opt->get_description() + " (troupe help " + sub->get_name() + ")";
    }
  }
  // "The following arguments were not expected: 1.5 --top-p": an unknown option named first
  if (dynamic_cast<const CLI::ExtrasError*>(&e))
    if (const size_t colon = msg.find(": "); colon != std::string::npos) {
      std::istringstream words(msg.substr(colon + 2));
      std::string w, option;
      while (words >> w)
        if (w.rfind("-", 0) == 0 && w.size() > 1 && option.empty()) option = w;
      std::string sub;
      for (CLI::App* s : app.get_subcommands()) sub = s->get_name();
      if (!option.empty() && !sub.empty())
        return "troupe " + sub + " has no option " + printable(option, false, 60) + "; troupe help " + sub +
               " lists its options";
      if (!sub.empty()) {  // a positional argument too many: `plot RUN1 RUN2`, `simulate ... extra`
        std::string extra = msg.substr(colon + 2);
        return "troupe " + sub + " got argument(s) it does not take: " + printable(extra, false, 120) +
               " (a path with spaces needs quotes; one command handles one run); troupe help " + sub +
               " shows its arguments";
      }
    }
  // "out is required": a command's positional argument missing, named with what it is
  if (dynamic_cast<const CLI::RequiredError*>(&e))
    if (const size_t at = msg.find(" is required"); at != std::string::npos && at > 0 && msg.rfind("-", 0) != 0)
      for (CLI::App* sub : app.get_subcommands())
        if (const CLI::Option* opt = sub->get_option_no_throw(msg.substr(0, at)))
          return "troupe " + sub->get_name() + " needs its " + str_upper(msg.substr(0, at)) + " argument (" +
                 opt->get_description() + "); troupe help " + sub->get_name() + " shows the usage";
  // "--logits-out: At Most 1 required but received 2", "--resume: 1 required TEXT missing": in troupe's words
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e))
    if (const size_t colon = msg.find(": "); colon != std::string::npos && msg.rfind("-", 0) == 0)
      for (CLI::App* sub : app.get_subcommands())
        if (const CLI::Option* opt = sub->get_option_no_throw(msg.substr(0, colon))) {
          const std::string name = msg.substr(0, colon), what = msg.substr(colon + 2);
          const std::string head = name + " of troupe " + sub->get_name();
          if (what.find("missing") != std::string::npos)
            return head + " needs a value after it: " + opt->get_description() + " (troupe help " + sub->get_name() + ")";
          return head + " takes one value and was given more; pass it once (" + opt->get_description() + ")";
        }
  if (dynamic_cast<const CLI::ValidationError*>(&e))  // "--seed: '...' is out of range ...": add what it takes
    if (const size_t colon = msg.find(": "); colon != std::string::npos && msg.rfind("--", 0) == 0)
      for (CLI::App* sub : app.get_subcommands())
        if (const CLI::Option* opt = sub->get_option_no_throw(msg.substr(0, colon)))
          return msg + " (" + opt->get_description() + "; troupe help " + sub->get_name() + ")";
  return msg + "; see troupe --help";
}

// Every command and the values CLI11 fills in. Not movable: the options point into it.
struct CommandLine {
  CLI::App app{"troupe: GPT training with pipeline-stage actors", "troupe"};
  std::string config_path, run_dir, resume, report, tensorboard;
  std::vector<std::string> sets;
  SimulateOptions so;
  std::string plot_dir, plot_out, plot_title;
  std::string export_dir, export_format = "safetensors", export_out;
  GenerateOptions go;
  PlanCommand pc;
  CLI::App *train = nullptr, *prepare = nullptr, *tokenize = nullptr, *simulate = nullptr, *plot = nullptr,
           *export_cmd = nullptr, *generate = nullptr, *plan = nullptr;
  CommandLine();
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;
};

// --version, train, prepare and its alias tokenize.
void add_training_commands(CommandLine& cl) {
  CLI::App& app = cl.app;
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("troupe ") + TROUPE_VERSION + " (git " + TROUPE_GIT_COMMIT +
                                        ")\nbuild: " + TROUPE_BUILD_OPTIONS,
                       "print the version, git commit and build options, then exit");
  cl.train = app.add_subcommand("train", "train a model (the main job)");
  cl.train->add_option("--config", cl.config_path, "TOML config file")->required();
  cl.train->add_option("--set", cl.sets, "override a key: section.key=value (repeatable; the last of a key wins)");
  cl.train->add_option("--run-dir", cl.run_dir, "run directory (default runs/<timestamp>)");
  cl.train->add_option("--resume", cl.resume,
                       "continue from a snapshot: its directory, or 'latest' (newest valid in checkpoint.dir)");
  cl.prepare = app.add_subcommand("prepare", "prepare the data: clean, deduplicate, tokenize, index (cached)");
  cl.tokenize = app.add_subcommand("tokenize", "an alias of prepare");
  for (auto* sub : {cl.prepare, cl.tokenize}) {
    sub->add_option("--config", cl.config_path, "TOML config file")->required();
    sub->add_option("--set", cl.sets, "override a key: section.key=value (repeatable; the last of a key wins)");
    sub->add_option("--report", cl.report, "also write the cleaning report as JSON to this file");
  }
}

// simulate, plot, export, generate, plan, launch (listed for --help), and train's outputs.
void add_tool_commands(CommandLine& cl) {
  CLI::App& app = cl.app;
  SimulateOptions& so = cl.so;
  cl.simulate = app.add_subcommand("simulate", "simulate a pipeline schedule: bubble, memory, timeline, trace");
  auto* sim = cl.simulate;
  sim->add_option("--schedule", so.schedule, "gpipe | 1f1b | interleaved | zb-h1 | FILE (default 1f1b, or --config's)");
  sim->add_option("--stages", so.P, "pipeline stages P, 1 to " + std::to_string(kMaxStages) + " (default 4, or --config's parallel.pp)")->check(kWholeNumberInRange);
  sim->add_option("--microbatches", so.M, "microbatches M, 1 to " + std::to_string(kMaxMicrobatches) + " (default 8, or --config's parallel.microbatches)")->check(kWholeNumberInRange);
  sim->add_option("--chunks", so.V, "virtual chunks per stage V, 1 to " + std::to_string(kMaxChunks) + " (default 1, or --config's parallel.chunks for interleaved)")->check(kWholeNumberInRange);
  sim->add_option("--cost", so.cost, "f=1,b=2,w=1,p2p=0 (b = full backward, w = its weight part)");
  sim->add_option("--trace", so.trace, "write a Chrome trace JSON");
  sim->add_option("--dump", so.dump, "write the schedule as an editable text file ('-' = stdout) and exit");
  sim->add_option("--config", so.config, "a training config: its model for activation bytes, its [parallel] schedule, pp, microbatches and chunks for the flags not given");
  sim->add_flag("--quiet", so.quiet, "no ASCII timeline");
  sim->add_option("--png", so.png, "draw the timeline per stage as a PNG (gnuplot)");
  cl.plot = app.add_subcommand("plot", "draw a run's curves (loss, val loss, lr, throughput, MFU) as a PNG");
  cl.plot->add_option("run_dir", cl.plot_dir, "run directory (holds metrics.jsonl)")->required();
  cl.plot->add_option("--out", cl.plot_out, "PNG file (default RUN_DIR/plot.png)");
  cl.plot->add_option("--title", cl.plot_title, "the picture's title (default RUN_DIR)");
  cl.export_cmd = app.add_subcommand("export", "write a snapshot's model as safetensors (GPT-2 Hugging Face names)");
  cl.export_cmd->add_option("snapshot", cl.export_dir, "snapshot directory (checkpoint.dir/step-<k>)")->required();
  cl.export_cmd->add_option("--format", cl.export_format, "safetensors (the only format)");
  cl.export_cmd->add_option("out", cl.export_out, "output file, e.g. model.safetensors")->required();
  GenerateOptions& go = cl.go;
  cl.generate = app.add_subcommand("generate", "sample text from a snapshot");
  auto* gen = cl.generate;
  gen->add_option("snapshot", go.dir, "snapshot directory (checkpoint.dir/step-<k>)")->required();
  gen->add_option("--prompt", go.prompt, "text to continue (default: a new document)");
  gen->add_option("--tokens", go.tokens, "tokens to generate, 1 to 100000 (default 64)")->check(kWholeNumberInRange);
  gen->add_option("--temperature", go.temperature, "softmax temperature, 0 = greedy (default 0.8)")->check(kDecimalReal);
  gen->add_option("--top-k", go.top_k, "sample among the k most likely tokens, a whole number from 0 to 2147483647 (more than the vocabulary is all), 0 = all (default 40)")->check(kWholeNumberInRange);
  gen->add_option("--seed", go.seed, "sampling seed, a whole number from 0 to 2^63 - 1 (default 1)")->check(kWholeNumberInRange);
  gen->add_option("--logits-out", go.logits_out, "write the prompt's next-token logits as JSON (checks)");
  PlanCommand& pc = cl.pc;
  cl.plan = app.add_subcommand("plan", "size a job on a cluster: memory, iteration time, MFU (docs/plan.md)");
  cl.plan->add_option("--config", cl.config_path, "TOML config file with a [cluster] section")->required();
  cl.plan->add_option("--set", cl.sets, "override a key: section.key=value (repeatable; the last of a key wins)");
  cl.plan->add_flag("--json", pc.json, "one JSON object on stdout");
  cl.plan->add_option("--search", pc.search, "vary these keys (comma list, or 'all') and list the fastest layouts");
  cl.plan->add_option("--calibrate", pc.calibrate, "fit this machine's costs from RUN_DIR (train --trace RUN_DIR/trace.json)");
  cl.plan->add_option("--tokens", pc.tokens, "tokens to train, 1 to 1e18: report the days it takes")->check(kDecimalReal);
  // launch is dispatched before parsing (it passes its command through); listed for --help
  app.add_subcommand("launch", "start the N processes of a job on this host: troupe launch --nprocs N -- troupe train ... "
                               "(troupe launch --help; docs/launch.md)")
      ->allow_extras();
  cl.train->add_option("--trace", trace_path_, "write a Chrome trace of measured spans; print measured vs simulated bubble");
  cl.train->add_option("--trace-png", trace_png_, "with --trace: draw the last step's measured timeline as a PNG");
  cl.train->add_option("--tensorboard", cl.tensorboard, "write TensorBoard event files (scalars) to DIR (train.tensorboard_dir)");
}

CommandLine::CommandLine() {
  add_training_commands(*this);
  add_tool_commands(*this);
}

// troupe help [COMMAND]: as --help, or COMMAND --help.
int print_help(CommandLine& cl, int argc, char** argv) {
  if (argc == 2) {  // as --help
    std::cout << cl.app.help();
    return 0;
  }
  if (argc > 3) {
    print_error("troupe help takes one command, e.g. troupe help train; troupe help lists them");
    return 2;
  }
  const std::string sub = argv[2];
  if (sub == "launch") {
    char help_flag[] = "--help";
    char* args[] = {help_flag, nullptr};
    return troupe::launch_main(1, args);
  }
  for (CLI::App* a : cl.app.get_subcommands({}))
    if (a->get_name() == sub) {
      std::cout << a->help("troupe");
      return 0;
    }
  print_error("troupe help " + sub + ": no such command; troupe help lists them");
  return 2;
}

// What is decided from argv before CLI11 parses it: an option where the command belongs,
// words after --version or --help, troupe launch (it passes its command through), troupe
// help, an unknown command. Returns the exit status, or nothing when CLI11 parses next.
std::optional<int> run_before_parsing(CommandLine& cl, int argc, char** argv) {
  if (argc > 1 && argv[1][0] == '-' && std::string(argv[1]) != "--help" && std::string(argv[1]) != "-h" &&
      std::string(argv[1]) != "--version") {
    print_error(std::string("unknown option '") + argv[1] +
                "'; troupe takes a command first: train, launch, prepare, tokenize, simulate, plan, export, generate "
                "or plot (troupe help), or --help / --version");
    return 2;
  }
  if (argc > 2 && (std::string(argv[1]) == "--version" || std::string(argv[1]) == "--help" ||
                   std::string(argv[1]) == "-h")) {
    print_error(std::string("troupe ") + argv[1] + " takes nothing after it (got '" + argv[2] +
                "'); for a command's help: troupe help COMMAND");
    return 2;
  }
  if (argc <= 1 || argv[1][0] == '-') return std::nullopt;
  const std::string cmd = argv[1];
  if (cmd == "launch") return troupe::launch_main(argc - 2, argv + 2);
  if (cmd == "help") return print_help(cl, argc, argv);
  if (cmd != "train" && cmd != "prepare" && cmd != "tokenize" && cmd != "simulate" && cmd != "export" &&
      cmd != "generate" && cmd != "plot" && cmd != "plan") {
    print_error("unknown command '" + cmd +
                "'; use train, launch, prepare, tokenize, simulate, plan, export, generate or plot (see troupe help)");
    return 2;
  }
  return std::nullopt;
}

// An option that took the next option as its value (`--resume --set k=v`: CLI11 gives --resume
// the value "--set"), as a sentence naming both; empty when none did.
std::string swallowed_option(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands())
    for (const CLI::Option* opt : sub->get_options()) {
      if (opt->count() == 0 || opt->get_type_size() == 0 || opt->get_name() == "--prompt") continue;  // (free text)
      for (const std::string& r : opt->results()) {
        if (r.rfind("--", 0) != 0 || r.size() < 3) continue;
        const std::string other = r.substr(0, r.find('='));
        if (sub->get_option_no_throw(other) == nullptr) continue;
        return opt->get_name() + " of troupe " + sub->get_name() + " needs a value after it, but the next argument is "
               "the option " + other + "; give " + opt->get_name() + " its value (" + opt->get_description() +
               ") before " + other;
      }
    }
  return "";
}

// CLI11's parse. Returns the exit status of a help or version request or a refusal, or
// nothing when the command runs next.
std::optional<int> parse_command_line(CommandLine& cl, int argc, char** argv) {
  // "--prompt=" is an empty value, as --prompt "" is: CLI11 would take the next argument as
  // the value (trial 62, M5: "--prompt= --tokens 3" prompted with "--tokens"), so the empty
  // value is passed on as its own argument, where the empty-value checks see it
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i)
    if (args[i].size() > 3 && args[i].rfind("--", 0) == 0 && args[i].back() == '=' &&
        args[i].find('=') == args[i].size() - 1) {
      args[i].pop_back();
      args.insert(args.begin() + (std::ptrdiff_t)i + 1, std::string());
      ++i;
    }
  std::vector<const char*> ptrs;
  for (const std::string& a : args) ptrs.push_back(a.c_str());
  try {
    cl.app.parse((int)ptrs.size(), ptrs.data());
  } catch (const CLI::CallForHelp& e) {
    return cl.app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return cl.app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return cl.app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string sentence = swallowed_option(cl.app);
    // "--config is required" when the user typed --confg: the unknown option is the cause
    if (sentence.empty() && dynamic_cast<const CLI::RequiredError*>(&e))
      for (CLI::App* sub : cl.app.get_subcommands())
        for (int i = 1; i < argc && sentence.empty(); ++i) {
          const std::string a = argv[i];
          if (a == "--") break;
          const std::string name = a.substr(0, a.find('='));
          if (name.rfind("--", 0) == 0 && name.size() > 2 && name != "--help" && !sub->get_option_no_throw(name))
            sentence = "troupe " + sub->get_name() + " has no option " + printable(name, false, 60) + "; troupe help " +
                       sub->get_name() + " lists its options";
        }
    print_error(sentence.empty() ? parse_error_sentence(cl.app, e) : sentence);
    return 2;
  }
  if (const std::string swallowed = swallowed_option(cl.app); !swallowed.empty()) {
    print_error(swallowed);
    return 2;
  }
  return std::nullopt;
}

// An option given an empty value (a path, a number) is a mistake, not "leave it out"; a
// value holding a control character is refused too. Throws UserError.
void check_option_values(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands())
    for (const CLI::Option* opt : sub->get_options()) {
      const std::string name = opt->get_name();
      if (opt->count() == 0 || opt->get_type_size() == 0 || name == "--prompt") continue;
      // an argument named as the help spells it (SNAPSHOT_DIR, not "snapshot": trial 63, F7)
      std::string upper = name == "snapshot" ? "SNAPSHOT_DIR" : name;
      for (char& ch : upper) ch = (char)std::toupper((unsigned char)ch);
      const std::string shown = name.empty() || name[0] != '-' ? "the " + upper + " argument" : name;
      for (const std::string& r : opt->results()) {
        // a path or number holding a newline or an escape would reach the terminal raw in the log lines
        // (C0 controls, DEL, and the C1 controls U+0080-U+009F: UTF-8 C2 80-9F, e.g. U+009B, a CSI)
        TROUPE_USER_CHECK(find_control(r) == std::string_view::npos) << shown << " of troupe " << sub->get_name()
                                    << " holds a control character (a newline, a tab or an escape); pass a plain value";
        // '~' reaches troupe only when quoted ('~/x', --run-dir=~/x): no shell expanded it, and a
        // folder named '~' would be made in the current directory
        if (name != "--set" && name != "--title" && !r.empty() && r[0] == '~')
          TROUPE_USER_FAIL() << shown << " of troupe "
                             << sub->get_name() << " is '" << printable(r, false, 120) << "', which starts with '~', "
                             << tilde_refusal(r, "the shell did not: it was quoted or after '='");
        if (name == "--title" || name == "--prompt") continue;  // (text: empty or blank is allowed)
        // only blanks (U+00A0 and U+3000 too): a file or folder named with them in the current
        // directory; a blank at either end: a typing slip that names another path
        TROUPE_USER_CHECK(name == "--set" || (!blank_text(r) && !blank_part(r)))
            << shown << " of troupe " << sub->get_name() << " is '" << printable(r, false, 80) << "', "
            << (blank_text(r) ? "only blanks" : "with a part made only of blanks or invisible characters")
            << "; give it a path" << (opt->get_required() ? std::string() : std::string(" or leave it out"));
        TROUPE_USER_CHECK(name == "--set" || !padded_text(r))
            << shown << " of troupe " << sub->get_name() << " is '" << printable(r, false, 200)
            << "', which starts or ends with a blank; remove it (a value with a blank at either end is almost "
               "always a slip)";
        if (name == "--run-dir" || name == "--tensorboard") continue;
        // a required one cannot be left out: its fix is a value, shown by its description
        TROUPE_USER_CHECK(!r.empty()) << shown << " of troupe " << sub->get_name() << " is empty; "
                                      << (opt->get_required() ? "give it a value (" + opt->get_description() + ")"
                                                              : std::string("give it a value or leave it out"))
                                      << " (troupe help " << sub->get_name() << ")";
      }
    }
}

// train's outputs (--tensorboard, --trace, --trace-png) must not land on the run's inputs
// or its own files. Throws UserError.
void refuse_train_outputs(const CommandLine& cl, const Config& c) {
  std::vector<std::string> files = {cl.config_path, c.data.corpus, c.data.tokenizer};
  if (!cl.run_dir.empty())
    for (const char* f : {"/metrics.jsonl", "/train.log", "/config.toml", "/.lock"}) files.push_back(cl.run_dir + f);
  // the snapshot --resume names is read (any other snapshot is refused by refuse_overwriting too)
  std::vector<std::string> dirs = {c.checkpoint.dir, c.data.cache_dir,
                                   cl.run_dir.empty() ? std::string() : cl.run_dir + "/checkpoints",
                                   cl.resume == "latest" ? std::string() : cl.resume};
  for (const DataSource& src : c.data.sources) dirs.push_back(src.path);  // a file or a folder
  const std::string tb = c.train.tensorboard_dir, tb_option = "--tensorboard (train.tensorboard_dir)";
  refuse_same_outputs({{trace_path_, "--trace"}, {trace_png_, "--trace-png"}, {tb, tb_option}});
  refuse_overwriting(tb, tb_option, files, dirs);
  const auto inside = [](const std::string& out, const std::string& dir) {
    const std::string o = resolved_path(out).string(), d = resolved_path(dir).string();
    return o.rfind(d + "/", 0) == 0;
  };
  if (!tb.empty()) {
    for (const auto& [out, option] : {std::pair{trace_path_, "--trace"}, std::pair{trace_png_, "--trace-png"}}) {
      TROUPE_USER_CHECK(out.empty() || out == "-" || !inside(out, tb))
          << option << " " << out << " lies inside the folder of " << tb_option << " " << tb
          << ", where this run writes its event files: pass a path outside it";
    }
  }
  dirs.push_back(tb);
  refuse_overwriting(trace_path_, "--trace", files, dirs, cl.run_dir);  // (a resumed run may trace itself again)
  refuse_overwriting(trace_png_, "--trace-png", files, dirs, cl.run_dir);
}

// Runs the command CLI11 parsed. Throws what the command throws.
int run_parsed_command(CommandLine& cl) {
  check_option_values(cl.app);
  if (cl.simulate->parsed())
    return cmd_simulate(cl.so, cl.simulate->get_option("--stages")->count() > 0,
                        cl.simulate->get_option("--microbatches")->count() > 0,
                        cl.simulate->get_option("--chunks")->count() > 0,
                        cl.simulate->get_option("--schedule")->count() > 0);
  if (cl.export_cmd->parsed()) {
    set_out_of_memory_fixes("run it on a machine with more memory (export holds the whole model once in fp32)");
    return cmd_export(cl.export_dir, cl.export_format, cl.export_out);
  }
  if (cl.generate->parsed()) {
    (void)kernels::gemm_choice();  // a wrong TROUPE_GEMM is refused before the model loads
    set_out_of_memory_fixes("lower --tokens, or run it on a machine with more memory (generate holds the whole "
                            "model and the context's activations)");
    return cmd_generate(cl.go);
  }
  if (cl.plot->parsed()) return cmd_plot(cl.plot_dir, cl.plot_out, cl.plot_title);
  const bool train = cl.train->parsed();
  TROUPE_USER_CHECK(!train || cl.train->get_option("--run-dir")->count() == 0 || !cl.run_dir.empty())
      << "--run-dir is empty; pass a folder (e.g. --run-dir runs/mine) or leave it out for runs/<timestamp>";
  TROUPE_USER_CHECK(!train || cl.train->get_option("--tensorboard")->count() == 0 || !cl.tensorboard.empty())
      << "--tensorboard is empty; pass a folder for the event files or leave it out";
  Config c = load_config(cl.config_path, cl.sets, cl.plan->parsed() ? kMaxPlanDevices : kMaxWorkers);
  if (!cl.tensorboard.empty()) c.train.tensorboard_dir = cl.tensorboard;
  if (train) {
    refuse_train_outputs(cl, c);
    return cmd_train(c, cl.run_dir, cl.resume, cl.config_path);
  }
  if (cl.prepare->parsed() || cl.tokenize->parsed()) {
    set_out_of_memory_fixes("lower model.vocab_size or data.tokenizer_sample_mb (the tokenizer's training "
                            "sample), or prepare on a machine with more memory");
    return cmd_prepare(c, cl.report, cl.config_path);
  }
  if (cl.plan->parsed()) {
    cl.pc.tokens_given = cl.plan->get_option("--tokens")->count() > 0;
    return cmd_plan(c, cl.pc);
  }
  return 1;
}

}  // namespace

int run_command(int argc, char** argv) {
  CommandLine cl;
  if (const std::optional<int> rc = run_before_parsing(cl, argc, argv)) return *rc;
  if (const std::optional<int> rc = parse_command_line(cl, argc, argv)) return *rc;
  try {
    return run_parsed_command(cl);
  } catch (const StdoutReaderGone&) {  // generate | head: the reader has what it wanted
    return 0;
  } catch (const UserError& e) {
    print_error(log_prefix_ + e.what());
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {  // the user's paths: a name too long, a link loop
    print_error(log_prefix_ + describe_filesystem_error(e));
    return 2;
  } catch (const std::bad_alloc& e) {  // a memory limit the user set or can raise: the sentence names the fix
    print_error(log_prefix_ + describe_exception(e));
    return 2;
  } catch (const std::system_error& e) {
    // a thread the system would not start (std::thread: EAGAIN) is a limit the user set or can raise
    if (e.code() == std::errc::resource_unavailable_try_again) {
      print_error(log_prefix_ + "cannot start another thread (" + e.what() + "): this process reached the limit on "
                  "threads (ulimit -u for the user, or a cgroup's pids.max); raise it, or use fewer threads "
                  "(train.threads, data.threads, fewer processes per host)");
      return 2;
    }
    print_error(log_prefix_ + describe_exception(e), false);
    return 1;
  } catch (const std::exception& e) {
    print_error(log_prefix_ + describe_exception(e), false);  // an internal failure: its wait-for graph below
    return 1;
  }
}

}  // namespace troupe::cli
