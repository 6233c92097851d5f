// cli/plot.cpp — `troupe plot RUN_DIR [--out FILE.png]`: a run's curves from its
// metrics.jsonl (README "metrics.jsonl"), drawn with gnuplot (cli/figures.h): loss and
// validation loss against steps and against tokens, learning rate, gradient norm,
// throughput and MFU; every resume (a "resumed_from" record) is marked by a dashed blue
// line, every recovery after a failure (a resume with "recovery", or
// "restarted_from_scratch") by a red one. Lines break at each mark, since a resume from an
// older snapshot repeats step numbers.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/common.h"
#include "cli/figures.h"
#include "core/error.h"
#include "core/read_file.h"

namespace fs = std::filesystem;

namespace troupe::cli {
namespace {

struct Mark {
  int64_t step;
  double tokens;  // tokens trained by that step
  bool recovery;
};

struct RunCurves {
  std::string train, val;  // gnuplot data: "step tokens loss lr grad_norm tokens/s mfu%", "step tokens val_loss"
  std::vector<Mark> marks;
  int64_t step_records = 0;
  double tokens_per_step = 0;
  bool has[8] = {};  // per column of `train`: any finite value
  bool has_val = false;  // any finite val_loss
  int64_t bad_lines = 0, first_bad_line = 0;  // lines skipped: not JSON objects, or a step that is not a whole number >= 0
  std::string first_bad_why;                   // what is wrong with the first, as a clause ("is not a JSON object ...")
  int64_t runs = 1, first_line = 1;            // fresh runs in the file; where the last (drawn) one starts
  int64_t beyond = 0;                          // values left out: beyond what gnuplot scales (|x| > 1e300, < 1e-300)
  std::string first_beyond;                    // the first, as "loss 1e+308 at step 1"
  size_t torn_bytes = 0;                       // the last line, unreadable and without its newline (still written?)
};

// j[key] x scale for gnuplot's data block, "NaN" (a gap) when absent or not a number. A
// value gnuplot cannot scale an axis to (|x| above 1e300 or a nonzero one below 1e-300: its
// axis arithmetic overflows) is a gap too, counted in rc.
std::string num(const nlohmann::json& j, const char* key, int64_t step, RunCurves& rc, double scale = 1) {
  if (!j.contains(key) || !j[key].is_number()) return "NaN";
  const double v = j[key].get<double>() * scale, a = std::fabs(v);
  if (std::isfinite(v) && (a > 1e300 || (a != 0 && a < 1e-300))) {
    if (rc.beyond++ == 0) rc.first_beyond = fmt::format("{} {} at step {}", key, v, step);
    return "NaN";
  }
  return fmt::format("{}", v);
}

// Batch tokens per step from the run's saved config (B x T), 0 when unknown.
double tokens_per_step(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::exists(run_dir + "/config.toml", ec)) return 0;
  try {
    Config c = Config::load(run_dir + "/config.toml");
    return (double)c.train.batch_size * c.train.seq_len;
  } catch (const std::exception&) {
    return 0;
  }
}

// Why a metrics line is skipped, as a clause after "line N".
std::string why_unreadable(const std::string& line) {
  try {
    const auto j = nlohmann::json::parse(line);
    if (!j.is_object()) return "is JSON but not an object";
    for (const char* k : {"loss", "val_loss"})
      if (j.contains(k) && !j[k].is_number() && !j[k].is_null())
        return std::string("has a \"") + k + "\" that is neither a number nor null";
    return "has a \"step\" that is not a whole number of 0 or more";
  } catch (const nlohmann::json::out_of_range&) {  // 1e999: a whole line, with a number no double holds
    return "holds a number out of range (beyond a double's 1.8e308)";
  } catch (const std::exception&) {
    return "is not a JSON object (a write cut short?)";
  }
}

RunCurves read_run(const std::string& run_dir) {
  RunCurves rc;
  rc.tokens_per_step = tokens_per_step(run_dir);
  std::vector<std::string> lines;
  bool torn_end = false;  // the file does not end with a newline: its last line may still be being written
  {
    // (a read that fails, /proc/self/mem's EIO, is named: an istream would read it as empty)
    const std::string text = std::filesystem::exists(run_dir + "/metrics.jsonl")
                                 ? read_file_checked(run_dir + "/metrics.jsonl", "metrics file",
                                                     "plot a run directory that troupe train wrote")
                                 : std::string();
    torn_end = !text.empty() && text.back() != '\n';
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  double tps = rc.tokens_per_step;  // tokens per step (from the config, else from the records)
  bool after_summary = false;       // the last record read was a run's summary
  int64_t last_step = 0;
  for (size_t line_no = 1; line_no <= lines.size(); ++line_no) {
    const std::string& line = lines[line_no - 1];
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() && line_no == lines.size() && torn_end) {  // a run still writing its last line
      rc.torn_bytes = line.size();
      break;
    }
    // (a negative step is no step troupe counts: trial 58, F6)
    const bool odd_step = j.is_object() && j.contains("step") && !j.contains("summary") &&
                          (!j["step"].is_number_integer() || (j["step"].is_number_integer() && j["step"].get<int64_t>() < 0));
    // a loss troupe never writes ("x": neither a number nor the null of a diverged step; trial 62, L12)
    const auto odd_loss = [&](const char* k) { return j.contains(k) && !j[k].is_number() && !j[k].is_null(); };
    if (j.is_discarded() || !j.is_object() || odd_step || odd_loss("loss") || odd_loss("val_loss")) {  // a line cut short (power lost mid-write): skipped, said below
      if (rc.bad_lines++ == 0) rc.first_bad_line = (int64_t)line_no, rc.first_bad_why = why_unreadable(line);
      continue;
    }
    if (j.contains("summary")) after_summary = true;
    if (!j.contains("step") || j.contains("summary")) continue;
    const int64_t k = j["step"].get<int64_t>();
    // a fresh run in a used run directory appends to its metrics.jsonl: after a summary, a
    // step that goes back without a resume mark starts another run; the last one is drawn
    const bool mark = j.contains("resumed_from") || j.contains("restarted_from_scratch");
    if (after_summary && !mark && k <= last_step) {
      const RunCurves fresh;
      rc.train = fresh.train, rc.val = fresh.val, rc.marks.clear(), rc.step_records = 0;
      std::copy(std::begin(fresh.has), std::end(fresh.has), std::begin(rc.has));
      rc.has_val = false;
      ++rc.runs;
      rc.first_line = (int64_t)line_no;
    }
    after_summary = false;
    last_step = k;
    if (mark) {
      rc.marks.push_back({k, k * tps, j.contains("recovery") || j.contains("restarted_from_scratch")});
      rc.train += "\n";  // break the lines: the steps after a mark may repeat earlier ones
      rc.val += "\n";
      continue;
    }
    if (rc.tokens_per_step == 0 && j.contains("tokens_per_s") && j["tokens_per_s"].is_number() && j["ms_per_step"].is_number())
      tps = j["tokens_per_s"].get<double>() * j["ms_per_step"].get<double>() / 1e3;
    const std::string tokens = fmt::format("{}", k * tps);
    if (j.contains("loss")) {
      ++rc.step_records;
      const std::string cols[] = {num(j, "loss", k, rc), num(j, "lr", k, rc), num(j, "grad_norm", k, rc),
                                  num(j, "tokens_per_s", k, rc), num(j, "mfu", k, rc, 100)};
      rc.train += fmt::format("{} {}", k, tokens);
      for (int c = 0; c < 5; ++c) {
        rc.train += " " + cols[c];
        rc.has[c + 3] = rc.has[c + 3] || cols[c] != "NaN";
      }
      rc.train += "\n";
    } else if (j.contains("val_loss")) {
      const std::string v = num(j, "val_loss", k, rc);
      rc.has_val = rc.has_val || v != "NaN";
      rc.val += fmt::format("{} {} {}\n", k, tokens, v);
    }
  }
  return rc;
}

// One panel of `train`'s column `col` against the step ("no data" when it has none).
std::string panel(const RunCurves& rc, int col, const std::string& title) {
  if (!rc.has[col])
    return "set title " + gp_quote(title) + "\nset label 99 'no data' at graph 0.5, graph 0.5 center\n"
           "plot [0:1][0:1] NaN notitle\nunset label 99\n";
  return "set title " + gp_quote(title) + fmt::format("\nplot $train using 1:{} with lines ls 1 notitle\n", col);
}

// A loss panel against column x (1 step, 2 tokens): the train and validation curves that
// hold a finite value (troupe writes a non-finite loss as null), "no finite loss" when none does.
std::string loss_panel(const RunCurves& rc, int x, const std::string& title) {
  if (!rc.has[3] && !rc.has_val)
    return "set title " + gp_quote(title) + "\nset label 99 'no finite loss (every loss is null or not a number)' at "
           "graph 0.5, graph 0.5 center\nplot [0:1][0:1] NaN notitle\nunset label 99\n";
  std::string curves;
  if (rc.has[3]) curves = fmt::format("$train using {}:3 with lines ls 1 title 'train'", x);
  if (rc.has_val)
    curves += fmt::format("{}$val using {}:3 with linespoints ls 2 title 'validation'", curves.empty() ? "" : ", ", x);
  return "set title " + gp_quote(title) + "\nplot " + curves + "\n";
}

// Vertical marks for one panel: x is the step, or the tokens at that step.
std::string marks_script(const RunCurves& rc, bool by_tokens) {
  std::string s = "unset arrow\nunset label\n";
  for (auto& m : rc.marks) {
    const double x = by_tokens ? m.tokens : (double)m.step;
    s += fmt::format("set arrow from {0}, graph 0 to {0}, graph 1 nohead dt 2 lw 1.5 lc rgb '{1}'\n", x,
                     m.recovery ? "#c0392b" : "#2471a3");
    s += fmt::format("set label '{}' at {}, graph 0.96 rotate by 90 right offset -0.6,0 tc rgb '{}' font 'sans,8'\n",
                     m.recovery ? "recovery" : "resume", x, m.recovery ? "#c0392b" : "#2471a3");
  }
  return s;
}

}  // namespace

int cmd_plot(const std::string& run_dir, std::string out, const std::string& title) {
  std::error_code ec;
  // a folder this user may not enter (or one on the way) is not "not a run directory"
  if (const std::string why = missing_reason(run_dir + "/metrics.jsonl"); why.rfind("cannot be reached", 0) == 0)
    TROUPE_USER_FAIL() << "'" << run_dir << "/metrics.jsonl' " << why << " pass the --run-dir of a troupe train run";
  TROUPE_USER_CHECK(fs::exists(fs::symlink_status(run_dir, ec)))
      << "'" << run_dir << "' does not exist; pass the --run-dir of a troupe train run, e.g. runs/<timestamp>";
  // the metrics file itself: its folder is meant (trial 61)
  TROUPE_USER_CHECK(fs::is_directory(run_dir, ec) || !fs::exists(run_dir, ec))
      << "'" << run_dir << "' is a file; plot takes the run directory that holds metrics.jsonl: pass "
      << (fs::path(run_dir).has_parent_path() ? fs::path(run_dir).parent_path().string() : std::string("."))
      << " (troupe plot RUN_DIR)";
  TROUPE_USER_CHECK(fs::is_directory(run_dir, ec) && fs::exists(run_dir + "/metrics.jsonl", ec))
      << "'" << run_dir << "' is not a troupe run directory (it has no metrics.jsonl); pass the --run-dir of a "
      << "troupe train run, e.g. runs/<timestamp>";
  TROUPE_USER_CHECK(fs::is_regular_file(run_dir + "/metrics.jsonl", ec))
      << run_dir << "/metrics.jsonl is not a regular file (a folder, a FIFO, a device or a link to one); pass the --run-dir of a "
      << "troupe train run, whose metrics.jsonl is a file";
  const uint64_t size = fs::file_size(run_dir + "/metrics.jsonl", ec);
  TROUPE_USER_CHECK(size <= (1ull << 30)) << run_dir << "/metrics.jsonl has " << size
                                          << " bytes, more than the 1 GiB plot reads (a million steps take ~200 MB); "
                                             "pass the --run-dir of a troupe train run";
  RunCurves rc = read_run(run_dir);
  // an unreadable line (a torn write) costs that line, not the run; a file of nothing else is not a run's
  TROUPE_USER_CHECK(rc.bad_lines == 0 || rc.step_records > 0)
      << run_dir << "/metrics.jsonl line " << rc.first_bad_line << " " << rc.first_bad_why
      << ", and no line holds a step record; pass the run directory of a troupe train run";
  if (rc.runs > 1)
    std::cerr << "warning: " << run_dir << "/metrics.jsonl holds " << rc.runs
              << " runs (a fresh run in this run directory started again from an earlier step after the previous "
                 "one's summary); drawing the last one, from line "
              << rc.first_line << std::endl;
  if (rc.bad_lines > 0)
    std::cerr << "warning: " << run_dir << "/metrics.jsonl line " << rc.first_bad_line
              << " " << rc.first_bad_why << "; skipped"
              << (rc.bad_lines > 1 ? fmt::format(", with {} more unreadable line(s)", rc.bad_lines - 1) : std::string())
              << std::endl;
  TROUPE_USER_CHECK(rc.step_records > 0)
      << run_dir << "/metrics.jsonl holds no step records yet"
      << (rc.torn_bytes > 0 ? fmt::format(" (its last line, {} bytes without a newline, is no JSON record: a write still "
                                          "going on, or a file troupe did not write)", rc.torn_bytes)
                            : std::string())
      << "; plot the run once it has trained a step";
  if (out.empty()) out = run_dir + "/plot.png";
  refuse_overwriting(out, "--out", {run_dir + "/metrics.jsonl", run_dir + "/train.log", run_dir + "/config.toml",
                                    run_dir + "/.lock"},
                     {run_dir + "/checkpoints"});
  check_png_output(out, "--out");
  std::string gp = "set terminal pngcairo size 1400,800 font 'sans,10' noenhanced\nset output " + gp_quote(png_tmp(out)) + "\n";
  gp += "$train << EOD\n" + rc.train + "EOD\n$val << EOD\n" + rc.val + "EOD\n";
  const auto resumes = std::count_if(rc.marks.begin(), rc.marks.end(), [](const Mark& m) { return !m.recovery; });
  const auto recoveries = (long)rc.marks.size() - resumes;
  std::string heading = title.empty() ? run_dir : title;
  if (!rc.marks.empty())
    heading += fmt::format(" ({} resume{}, {} recover{})", resumes, resumes == 1 ? "" : "s", recoveries,
                           recoveries == 1 ? "y" : "ies");
  gp += "set multiplot layout 2,3 title " + gp_quote(heading) + "\n";
  gp += "set grid lc rgb '#dddddd'\nset key bottom left\nset xlabel 'step'\n";
  gp += "set style line 1 lc rgb '#4c72b0' lw 1.5\nset style line 2 lc rgb '#dd8452' lw 2 pt 7 ps 0.6\n";
  gp += marks_script(rc, false);
  gp += loss_panel(rc, 1, "loss");
  gp += marks_script(rc, true);
  gp += "set xlabel 'tokens'\n" + loss_panel(rc, 2, "loss against tokens");
  gp += "set xlabel 'step'\n" + marks_script(rc, false);
  gp += panel(rc, 4, "learning rate");
  gp += panel(rc, 5, "gradient norm (before clipping)");
  gp += panel(rc, 6, "throughput (tokens/s)");
  gp += panel(rc, 7, "MFU (%, against the measured fp32 peak)");
  gp += "unset multiplot\n";
  if (rc.beyond > 0)
    std::cerr << "warning: " << run_dir << "/metrics.jsonl holds " << rc.beyond << " value(s) beyond what gnuplot can "
              << "scale an axis to (the first: " << rc.first_beyond << "); they are left out of the plot" << std::endl;
  if (!rc.has[3] && !rc.has_val)
    std::cerr << "warning: " << run_dir << "/metrics.jsonl holds no finite loss (each is null: the run diverged, or "
              << "not a number); the loss panels say so" << std::endl;
  render_png(gp, out, "--out", "a run directory with fewer step records");
  std::string marked;
  for (auto& m : rc.marks) marked += fmt::format("{}{} at step {}", marked.empty() ? "; marked: " : ", ",
                                                 m.recovery ? "recovery" : "resume", m.step);
  std::cout << "wrote " << out << " (" << rc.step_records << (rc.step_records == 1 ? " step record" : " step records") << marked << ")" << std::endl;
  return 0;
}

}  // namespace troupe::cli
