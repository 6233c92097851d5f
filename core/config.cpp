#include "core/config.h"

#include <thread>
#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <functional>
#include <set>
#include <sstream>
#include <toml++/toml.h>
#include <variant>

#include "core/error.h"
#include "core/text.h"

namespace troupe {
namespace {
bool has_control(const std::string& s);  // a control character in a string value (below)

using Ref = std::variant<int*, uint64_t*, double*, std::string*, bool*>;
struct Key {
  std::string name;  // "section.key"
  std::function<Ref(Config&)> ref;
};

#define K(sec, field) Key{#sec "." #field, [](Config& c) -> Ref { return &c.sec.field; }}
const std::vector<Key>& key_table() {
  static const std::vector<Key> t = {
      K(model, n_layer),        K(model, n_head),          K(model, n_embd),        K(model, block_size),
      K(model, vocab_size),     K(model, dropout),     K(parallel, pp),           K(parallel, tp),         K(parallel, dp),
      K(parallel, microbatches), K(parallel, schedule),    K(parallel, chunks),      K(parallel, sequence_parallel), K(parallel, placement), K(parallel, dp_bucket_mb),    K(train, steps),         K(train, batch_size),
      K(train, seq_len),        K(train, seed),            K(train, eval_interval), K(train, eval_batches),
      K(train, threads),        K(train, sample_tokens),   K(train, timeout_s),     K(train, recompute),     K(train, precision), K(train, device),
      K(train, initial_loss_scale), K(train, min_loss_scale), K(train, loss_scale_window), K(train, hysteresis), K(train, tensorboard_dir), K(optim, lr),
      K(optim, min_lr),         K(optim, warmup_steps),    K(optim, lr_decay_steps), K(optim, weight_decay),
      K(optim, grad_clip),      K(optim, beta1),           K(optim, beta2),         K(optim, eps),
      K(data, corpus),          K(data, val_fraction),     K(data, tokenizer),      K(data, cache_dir),
      K(data, tokenizer_sample_mb), K(data, special_tokens), K(data, threads),
      K(checkpoint, dir),       K(checkpoint, interval),   K(checkpoint, keep_last), K(checkpoint, max_failures), K(checkpoint, memory_interval),
      K(fault, policy),         K(fault, max_restarts),    K(fault, timeout_s),       K(fault, heartbeat_s),   K(fault, join_timeout_s),
      K(cluster, gpu),          K(cluster, gpus_per_node), K(cluster, nodes),     K(cluster, intra_node_gbps),
      K(cluster, inter_node_gbps), K(cluster, latency_us),
  };
  return t;
}
#undef K

const Key* find_key(const std::string& name) {
  for (auto& k : key_table())
    if (k.name == name) return &k;
  return nullptr;
}

[[noreturn]] void unknown_key(const std::string& name, const std::string& where) {
  std::string sec = name.substr(0, name.find('.'));
  std::string known;
  for (auto& k : key_table())
    if (k.name.rfind(sec + ".", 0) == 0) known += (known.empty() ? "" : ", ") + k.name;
  if (known.empty())
    for (auto& k : key_table()) known += (known.empty() ? "" : ", ") + k.name;
  throw UserError("unknown config key '" + name + "'" + where + "; remove it or use one of: " + known);
}

std::string example(const Ref& r) {
  if (std::holds_alternative<std::string*>(r)) return "\"" + *std::get<std::string*>(r) + "\"";
  if (auto* p = std::get_if<double*>(&r)) return fmt::format("{}", **p);  // shortest exact form
  if (auto* p = std::get_if<int*>(&r)) return std::to_string(**p);
  if (auto* p = std::get_if<bool*>(&r)) return **p ? "true" : "false";
  return std::to_string(*std::get<uint64_t*>(r));
}

// Assigns a TOML value to a key, checking its type.
void assign(Config& c, const Key& k, const toml::node& v, const std::string& where) {
  Ref r = k.ref(c);
  auto bad = [&](const char* want) {  // the value quoted on one short line (an array could be 100,000 lines)
    std::string got;
    if (const auto* a = v.as_array()) {
      got = "an array of " + std::to_string(a->size()) + " value(s)";
    } else if (v.is_table()) {
      got = "a table";
    } else {
      std::ostringstream os;
      v.visit([&](auto&& n) { os << n; });
      got = printable(os.str(), false, 80);
    }
    throw UserError("config key '" + k.name + "'" + where + " must be " + want + ", got " + got + "; e.g. " + k.name +
                    " = " + example(k.ref(c)));
  };
  if (auto* p = std::get_if<int*>(&r)) {
    auto x = v.value<int64_t>();
    if (!v.is_integer() || !x) bad("an integer");
    if (*x < INT32_MIN || *x > INT32_MAX) bad("an integer in 32-bit range");
    **p = static_cast<int>(*x);
  } else if (auto* p = std::get_if<uint64_t*>(&r)) {
    auto x = v.value<int64_t>();
    if (!v.is_integer() || !x || *x < 0) bad("a non-negative integer");
    **p = static_cast<uint64_t>(*x);
  } else if (auto* p = std::get_if<double*>(&r)) {
    if (!v.is_number()) bad("a number");
    **p = *v.value<double>();
  } else if (auto* p = std::get_if<std::string*>(&r)) {
    if (!v.is_string()) bad("a string");
    const std::string text = *v.value<std::string>();
    TROUPE_USER_CHECK(!has_control(text))
        << "config key '" << k.name << "'" << where
        << " holds a control character (NUL, a newline, an escape, ...); write the value without it";
    **p = text;
  } else if (auto* p = std::get_if<bool*>(&r)) {
    if (!v.is_boolean()) bad("true or false");
    **p = *v.value<bool>();
  }
}

// The keys of one [[data.sources]] entry, each with its field.
using SourceRef = std::variant<std::string DataSource::*, double DataSource::*, bool DataSource::*>;
const std::vector<std::pair<std::string, SourceRef>>& source_keys() {
  static const std::vector<std::pair<std::string, SourceRef>> t = {
      {"name", &DataSource::name},     {"path", &DataSource::path},
      {"format", &DataSource::format}, {"field", &DataSource::field},
      {"glob", &DataSource::glob},     {"weight", &DataSource::weight},
      {"utf8", &DataSource::utf8},     {"normalize", &DataSource::normalize},
      {"dedup", &DataSource::dedup},   {"near_dedup", &DataSource::near_dedup},
      {"near_threshold", &DataSource::near_threshold}, {"quality", &DataSource::quality},
  };
  return t;
}

// [[data.sources]]: an array of tables, each with the keys of source_keys().
std::vector<DataSource> parse_sources(const toml::node& node, const std::string& path) {
  const auto* arr = node.as_array();
  TROUPE_USER_CHECK(arr != nullptr) << "data.sources in " << path
                                    << " must be an array of tables: write each source as [[data.sources]]";
  std::vector<DataSource> out;
  for (size_t i = 0; i < arr->size(); ++i) {
    const auto* t = arr->get(i)->as_table();
    const std::string where = fmt::format("data.sources[{}] (line {} of {})", i, arr->get(i)->source().begin.line, path);
    TROUPE_USER_CHECK(t != nullptr) << where << " is not a table; write each source as [[data.sources]]";
    DataSource s;
    for (auto&& [key, val] : *t) {
      const std::string k(key.str());
      const auto it = std::find_if(source_keys().begin(), source_keys().end(), [&](auto& e) { return e.first == k; });
      if (it == source_keys().end()) {
        std::string known;
        for (auto& e : source_keys()) known += (known.empty() ? "" : ", ") + e.first;
        throw UserError("unknown key '" + k + "' in " + where + "; use one of: " + known);
      }
      std::visit(
          [&](auto member) {
            using T = std::remove_reference_t<decltype(s.*member)>;
            auto v = val.template value<T>();
            const bool ok = v && (std::is_same_v<T, double> ? val.is_number()
                                  : std::is_same_v<T, bool> ? val.is_boolean()
                                                            : val.is_string());
            TROUPE_USER_CHECK(ok) << where << " key '" << k << "' must be "
                                  << (std::is_same_v<T, double> ? "a number" : std::is_same_v<T, bool> ? "true or false" : "a string");
            if constexpr (std::is_same_v<T, std::string>)
              TROUPE_USER_CHECK(!has_control(*v)) << where << " key '" << k
                                                  << "' holds a control character (NUL, a newline, an escape, ...); "
                                                     "write the value without it";
            s.*member = *v;
          },
          it->second);
    }
    out.push_back(std::move(s));
  }
  return out;
}

// The blend as one line of TOML (inline tables), so that key_values() compares it as one key.
std::string sources_text(const std::vector<DataSource>& sources) {
  std::string out = "[";
  for (size_t i = 0; i < sources.size(); ++i) {
    out += i ? ", {" : "{";
    bool first = true;
    for (auto& [k, ref] : source_keys()) {
      out += (first ? " " : ", ") + k + " = ";
      first = false;
      std::visit(
          [&](auto member) {
            using T = std::remove_reference_t<decltype(sources[i].*member)>;
            const auto& v = sources[i].*member;
            if constexpr (std::is_same_v<T, std::string>) {
              std::ostringstream os;
              os << toml::value<std::string>(v);
              out += os.str();
            } else if constexpr (std::is_same_v<T, bool>) {
              out += v ? "true" : "false";
            } else {
              out += fmt::format("{}", v);
            }
          },
          ref);
    }
    out += " }";
  }
  return out + "]";
}

}  // namespace

std::vector<DataSource> DataConfig::blend() const {
  if (!sources.empty()) return sources;
  DataSource s;  // the old keys read the corpus as before: no step that could drop a document
  s.name = "corpus";
  s.path = corpus;
  s.normalize = s.dedup = s.near_dedup = s.quality = false;
  return {s};
}

std::vector<std::string> Config::keys() {
  std::vector<std::string> out;
  for (auto& k : key_table()) out.push_back(k.name);
  return out;
}

Config Config::load(const std::string& path) {
  std::error_code ec;
  TROUPE_USER_CHECK(std::filesystem::is_regular_file(path, ec))
      << "config file '" << path << "' " << (std::filesystem::exists(path, ec) ? "is not a regular file" : "does not exist")
      << "; pass a TOML file to --config (e.g. configs/sotu.toml)";
  TROUPE_USER_CHECK(std::filesystem::file_size(path, ec) <= (16u << 20))
      << "config file '" << path << "' has " << std::filesystem::file_size(path, ec)
      << " bytes, more than the 16 MiB a config may have; pass a TOML config to --config (e.g. configs/sotu.toml)";
  std::ifstream f(path);
  TROUPE_USER_CHECK(f.good()) << "config file '" << path << "' cannot be read; pass a readable file to --config (e.g. configs/sotu.toml)";
  std::stringstream text;
  text << f.rdbuf();
  return parse(text.str(), path);
}

namespace {
// toml++ parses dotted keys, [a.b.c] headers and nested arrays/inline tables by recursion: a
// key of 50,000 parts overflowed the stack (SIGSEGV in every command reading the config).
// troupe's keys have two parts and its values little nesting, so the text is refused past
// 64 levels, counted outside strings: dots in a key or header, open brackets and braces.
void check_toml_nesting(const std::string& text, const std::string& where) {
  constexpr int kMaxDepth = 64;
  int depth = 0, line = 1, dots = 0;
  char quote = 0;
  bool comment = false, key_part = true;  // key_part: before the '=' of a line (or in a header)
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '\n') {
      ++line, dots = 0, comment = false, key_part = depth == 0;
      if (quote == '"' || quote == '\'') quote = 0;  // (a multi-line string is read as several lines: conservative)
      continue;
    }
    if (comment) continue;
    if (quote) {
      if (ch == '\\' && quote == '"') ++i;
      else if (ch == quote) quote = 0;
      continue;
    }
    if (ch == '"' || ch == '\'') quote = ch;
    else if (ch == '#') comment = true;
    else if (ch == '=') key_part = false;
    // a dot after a name (a.b, also a key inside an inline table), not in a number (1.5)
    else if (ch == '.' && (key_part || (i > 0 && !std::isdigit((unsigned char)text[i - 1])))) ++dots;
    else if (ch == '[' || ch == '{') ++depth;
    else if ((ch == ']' || ch == '}') && depth > 0) --depth;
    TROUPE_USER_CHECK(dots <= kMaxDepth && depth <= kMaxDepth)
        << where << " nests deeper than " << kMaxDepth << " levels at line " << line
        << (dots > kMaxDepth ? " (a key of more dotted parts)" : " (brackets or braces)")
        << "; troupe's config keys are section.key: fix the file";
  }
}

// A string value that would reach the terminal or a path raw: NUL (cuts a path short),
// C0 controls and DEL, and the C1 controls U+0080-U+009F (UTF-8 C2 80-9F).
bool has_control(const std::string& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char ch = (unsigned char)s[i];
    if (ch < 0x20 || ch == 0x7F) return true;
    if (ch == 0xC2 && i + 1 < s.size() && (unsigned char)s[i + 1] >= 0x80 && (unsigned char)s[i + 1] <= 0x9F) return true;
  }
  return false;
}
}  // namespace

Config Config::parse(const std::string& text, const std::string& path) {
  check_toml_nesting(text, "config file '" + path + "'");
  toml::table tbl;
  try {
    tbl = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "config file '" << path << "' is not valid TOML at line " << e.source().begin.line << ": "
       << e.description() << "; fix the syntax";
    throw UserError(os.str());
  }
  Config c;
  std::string where = " in " + path;
  for (auto&& [sec, node] : tbl) {
    auto* t = node.as_table();
    if (!t && find_key(std::string(sec.str())))  // "model.n_layer" = 2: one quoted key, not n_layer of [model]
      throw UserError("config key \"" + std::string(sec.str()) + "\"" + where +
                      " is quoted, so TOML reads it as one top-level key whose name holds a dot, not as a key of a "
                      "section; write it without the quotes (" + std::string(sec.str()) + " = ...)");
    if (!t) unknown_key(std::string(sec.str()), where);
    for (auto&& [key, val] : *t) {
      std::string name = std::string(sec.str()) + "." + std::string(key.str());
      if (name == "data.sources") {
        c.data.sources = parse_sources(val, path);
        continue;
      }
      const Key* k = find_key(name);
      if (!k) unknown_key(name, where);
      assign(c, *k, val, where);
    }
  }
  return c;
}

void Config::set(const std::string& assignment) {
  auto eq = assignment.find('=');
  TROUPE_USER_CHECK(eq != std::string::npos && eq > 0)
      << "--set '" << assignment << "' must look like section.key=value (e.g. --set train.steps=10)";
  std::string name = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  TROUPE_USER_CHECK(name.rfind("data.sources", 0) != 0)
      << "--set cannot change data.sources; edit the [[data.sources]] tables of the config file";
  const Key* k = find_key(name);
  if (!k) unknown_key(name, " (from --set)");
  // Parse the value as TOML; a bare word is taken as a string.
  toml::table t;
  check_toml_nesting("v = " + value, "--set " + name);
  try {
    t = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    t = toml::table{};
    t.insert("v", value);
  }
  if (std::holds_alternative<std::string*>(k->ref(*this)) && !t["v"].is_string()) {
    t = toml::table{};
    t.insert("v", value);
  }
  // a decimal TOML's parser will not take (hundreds of digits, 1e-320) is still a number
  if (std::holds_alternative<double*>(k->ref(*this)) && !t["v"].is_number() && !value.empty() &&
      !std::isspace((unsigned char)value[0])) {
    char* end = nullptr;
    const double d = std::strtod(value.c_str(), &end);
    if (end == value.c_str() + value.size() && std::isfinite(d)) {
      t = toml::table{};
      t.insert("v", d);
    }
  }
  assign(*this, *k, *t["v"].node(), " (from --set)");
}

void Config::validate(int64_t max_workers) const {
  auto& m = model;
  auto& p = parallel;
  TROUPE_USER_CHECK(m.n_layer >= 1) << "model.n_layer = " << m.n_layer << " must be at least 1";
  TROUPE_USER_CHECK(m.n_head >= 1) << "model.n_head = " << m.n_head << " must be at least 1";
  TROUPE_USER_CHECK(m.n_embd >= 1) << "model.n_embd = " << m.n_embd << " must be at least 1";
  // upper bounds: far above any model trained (MT-NLG 530B: 105 layers, n_embd 20480), low
  // enough that parameter and activation counts cannot overflow 64-bit arithmetic
  TROUPE_USER_CHECK(m.n_layer <= 16384) << "model.n_layer = " << m.n_layer << " exceeds 16384; use fewer layers";
  TROUPE_USER_CHECK(m.n_embd <= 262144) << "model.n_embd = " << m.n_embd << " exceeds 262144; use a smaller width";
  TROUPE_USER_CHECK(m.vocab_size <= (1 << 24)) << "model.vocab_size = " << m.vocab_size
                                               << " exceeds 16777216; use a smaller vocabulary";
  TROUPE_USER_CHECK(m.block_size <= (1 << 20)) << "model.block_size = " << m.block_size
                                               << " exceeds 1048576; use a shorter context";
  TROUPE_USER_CHECK(m.block_size >= 1) << "model.block_size = " << m.block_size << " must be at least 1";
  TROUPE_USER_CHECK(m.n_head <= m.n_embd) << "model.n_head = " << m.n_head << " exceeds model.n_embd = " << m.n_embd
                                          << ": each head needs at least one channel; use fewer heads";
  if (m.n_embd % m.n_head != 0) {
    const int64_t lo = m.n_embd / m.n_head * m.n_head, hi = lo + m.n_head;
    TROUPE_USER_FAIL() << "model.n_embd = " << m.n_embd << " is not divisible by model.n_head = " << m.n_head
                       << "; use n_embd = " << (lo > 0 ? std::to_string(lo) + " or " : "") << hi
                       << ", or an n_head that divides " << m.n_embd;
  }
  TROUPE_USER_CHECK(m.dropout >= 0 && m.dropout < 1) << "model.dropout = " << m.dropout
                                                    << " must be in [0, 1), e.g. 0.1 (0 disables dropout)";
  TROUPE_USER_CHECK(m.vocab_size >= 2) << "model.vocab_size = " << m.vocab_size << " must be at least 2";
  TROUPE_USER_CHECK(p.pp >= 1) << "parallel.pp = " << p.pp << " must be at least 1";
  TROUPE_USER_CHECK(p.pp <= m.n_layer) << "parallel.pp = " << p.pp << " exceeds model.n_layer = " << m.n_layer
                                       << ": every pipeline stage needs at least one layer; use parallel.pp <= "
                                       << m.n_layer;
  if (p.sequence_parallel) {
    TROUPE_USER_CHECK(p.tp == 1 || p.schedule != "zb-h1")
        << "parallel.sequence_parallel does not combine with schedule zb-h1 yet; use another schedule or turn it off";
    const int rows = (train.batch_size / std::max(1, p.dp * p.microbatches)) * train.seq_len;
    TROUPE_USER_CHECK(p.tp >= 1 && rows % p.tp == 0)
        << "parallel.sequence_parallel shards the " << rows << " token rows of a microbatch over parallel.tp = " << p.tp
        << " ranks, which needs (train.batch_size / parallel.microbatches) * train.seq_len to divide by parallel.tp";
  }
  TROUPE_USER_CHECK(p.chunks >= 1) << "parallel.chunks = " << p.chunks << " must be at least 1";
  TROUPE_USER_CHECK(p.pp * p.chunks <= m.n_layer)
      << "parallel.pp x parallel.chunks = " << p.pp * p.chunks << " virtual stages exceed model.n_layer = " << m.n_layer
      << ": every chunk needs at least one layer; use chunks <= " << std::max(1, m.n_layer / p.pp);
  TROUPE_USER_CHECK(p.tp >= 1) << "parallel.tp = " << p.tp << " must be at least 1";
  if (m.n_head % p.tp != 0) {
    std::string ok;
    for (int t = 1; t <= m.n_head; ++t)
      if (m.n_head % t == 0) ok += (ok.empty() ? "" : ", ") + std::to_string(t);
    TROUPE_USER_FAIL() << "parallel.tp = " << p.tp << " does not divide model.n_head = " << m.n_head
                       << ": tensor parallelism splits the attention heads (and the MLP width 4*n_embd) over the TP "
                          "ranks; use parallel.tp in {" << ok << "}";
  }
  TROUPE_USER_CHECK(p.dp >= 1) << "parallel.dp = " << p.dp << " must be at least 1";
  TROUPE_USER_CHECK(p.dp_bucket_mb >= 0 && p.dp_bucket_mb <= 1 << 20)
      << "parallel.dp_bucket_mb = " << p.dp_bucket_mb
      << " must be between 0 (no overlap: one reduce-scatter after the backward) and 1048576 MiB";
  TROUPE_USER_CHECK((int64_t)p.pp * p.tp * p.dp <= max_workers)
      << "parallel.pp x tp x dp = " << (int64_t)p.pp * p.tp * p.dp << " stage workers exceed the limit of "
      << max_workers << (max_workers == kMaxWorkers ? " that troupe train runs" : "") << "; use a smaller layout";
  TROUPE_USER_CHECK(!p.schedule.empty()) << "parallel.schedule is empty; use gpipe, 1f1b, interleaved, zb-h1 or a file";
  TROUPE_USER_CHECK(p.microbatches >= 1) << "parallel.microbatches = " << p.microbatches << " must be at least 1";
  auto& t = train;
  TROUPE_USER_CHECK(t.batch_size >= 1 && t.batch_size <= kMaxBatch)
      << "train.batch_size = " << t.batch_size << "; use 1 to " << kMaxBatch
      << " sequences per step (MT-NLG 530B trained with 1920)";
  TROUPE_USER_CHECK(p.microbatches <= t.batch_size)
      << "parallel.microbatches = " << p.microbatches << " exceeds train.batch_size = " << t.batch_size
      << ": a microbatch holds at least one sequence; use parallel.microbatches <= " << t.batch_size;
  if (t.batch_size % ((int64_t)p.dp * p.microbatches) != 0) {
    const int per = t.batch_size / std::max(1, p.dp);
    std::string divs;  // the divisors of per, listed while there are few
    for (int d = 1, n = 0; d <= std::max(1, per) && n < 24; ++d)
      if (per % d == 0 && t.batch_size % p.dp == 0) divs += (divs.empty() ? "" : ", ") + std::to_string(d), ++n;
    TROUPE_USER_FAIL() << "train.batch_size = " << t.batch_size << " cannot be split into parallel.dp = " << p.dp
                       << " replicas x parallel.microbatches = " << p.microbatches << " equal microbatches; "
                       << "use " << (divs.empty() ? "" : "microbatches in {" + divs + "}, ")
                       << "another parallel.dp, or a batch_size that is a multiple of " << (int64_t)p.dp * p.microbatches;
  }
  TROUPE_USER_CHECK(t.seq_len >= 1) << "train.seq_len = " << t.seq_len << " must be at least 1";
  TROUPE_USER_CHECK(t.seq_len <= m.block_size) << "train.seq_len = " << t.seq_len << " exceeds model.block_size = "
                                               << m.block_size << "; lower train.seq_len or raise model.block_size";
  TROUPE_USER_CHECK(t.steps >= 0) << "train.steps = " << t.steps << " must be >= 0 (0 only evaluates)";
  TROUPE_USER_CHECK(t.eval_interval >= 0) << "train.eval_interval = " << t.eval_interval
                                          << " must be >= 0 (0 = evaluate only at the end)";
  TROUPE_USER_CHECK(t.eval_batches >= 1 && t.eval_batches <= kMaxEvalBatches)
      << "train.eval_batches = " << t.eval_batches << "; use 1 to " << kMaxEvalBatches;
  TROUPE_USER_CHECK(t.threads >= 0 && t.threads <= kMaxThreads)
      << "train.threads = " << t.threads << "; use 0 (all cores) to " << kMaxThreads
      << " (more threads than cores only slow the workers down)";
  TROUPE_USER_CHECK(t.sample_tokens >= 0 && t.sample_tokens <= kMaxSampleTokens)
      << "train.sample_tokens = " << t.sample_tokens << "; use 0 (no sample) to " << kMaxSampleTokens;
  TROUPE_USER_CHECK(t.timeout_s >= 0.5 && t.timeout_s <= kMaxWaitS)
      << "train.timeout_s = " << t.timeout_s << "; use 0.5 to " << kMaxWaitS << " seconds"
      << " (a week; the default is 300)";
  TROUPE_USER_CHECK(t.device == "cpu" || t.device == "cuda")
      << "train.device = '" << t.device << "'; use \"cpu\" (the default) or \"cuda\"";
  TROUPE_USER_CHECK(t.recompute == "none" || t.recompute == "selective" || t.recompute == "full")
      << "train.recompute = '" << t.recompute << "'; use \"none\", \"selective\" (recompute the attention core in "
      << "backward) or \"full\" (recompute each layer's activations in backward)";
  TROUPE_USER_CHECK(t.precision == "fp32" || t.precision == "bf16" || t.precision == "fp16")
      << "train.precision = '" << t.precision << "'; use \"fp32\", \"bf16\" or \"fp16\"";
  TROUPE_USER_CHECK(t.min_loss_scale > 0 && t.initial_loss_scale >= t.min_loss_scale && std::isfinite(t.initial_loss_scale))
      << "train.initial_loss_scale = " << fmt::format("{}", t.initial_loss_scale)
      << " and train.min_loss_scale = " << fmt::format("{}", t.min_loss_scale)
      << "; need finite numbers with 0 < min_loss_scale <= initial_loss_scale (Megatron's defaults: 4294967296 and 1)";
  TROUPE_USER_CHECK(t.initial_loss_scale <= 0x1p64)
      << "train.initial_loss_scale = " << fmt::format("{}", t.initial_loss_scale)
      << "; use at most 2^64 = 18446744073709551616 (Megatron's default is 2^32 = 4294967296): a larger scale "
         "overflows fp16 gradients at every step";
  for (auto [name, v] : {std::pair<const char*, double>{"train.initial_loss_scale", t.initial_loss_scale},
                         {"train.min_loss_scale", t.min_loss_scale}}) {
    int e = 0;
    TROUPE_USER_CHECK(std::frexp(v, &e) == 0.5) << name << " = " << fmt::format("{}", v)
                                                << " must be a power of two (unscaling by it is then exact), e.g. "
                                                << fmt::format("{}", std::exp2(std::round(std::log2(v))));
  }
  TROUPE_USER_CHECK(t.loss_scale_window >= 1) << "train.loss_scale_window = " << t.loss_scale_window << "; use >= 1 (default 1000)";
  TROUPE_USER_CHECK(parallel.placement == "tp-first" || parallel.placement == "pp-first")
      << "parallel.placement = \"" << parallel.placement << "\"; use \"tp-first\" or \"pp-first\"";
  TROUPE_USER_CHECK(fault.policy == "restart" || fault.policy == "abort")
      << "fault.policy = \"" << fault.policy << "\"; use \"restart\" (start the job again from the newest snapshot) or "
      << "\"abort\" (stop it)";
  TROUPE_USER_CHECK(fault.max_restarts >= 0)
      << "fault.max_restarts = " << fault.max_restarts << "; use 0 or more";
  TROUPE_USER_CHECK(fault.timeout_s >= 0.5 && fault.timeout_s <= kMaxWaitS)
      << "fault.timeout_s = " << fault.timeout_s << "; use 0.5 to " << kMaxWaitS << " seconds"
      << " (default 30)";
  TROUPE_USER_CHECK(fault.heartbeat_s >= 0.05 && fault.heartbeat_s < fault.timeout_s)
      << "fault.heartbeat_s = " << fault.heartbeat_s << "; use a period of at least 0.05 s, shorter than fault.timeout_s ("
      << fault.timeout_s << ")";
  TROUPE_USER_CHECK(fault.join_timeout_s > 0 && fault.join_timeout_s <= kMaxWaitS)
      << "fault.join_timeout_s = " << fault.join_timeout_s << "; use a positive number of seconds up to "
      << kMaxWaitS << " (default 300)";
  TROUPE_USER_CHECK(checkpoint.interval >= 0)
      << "checkpoint.interval = " << checkpoint.interval << "; use a number of steps >= 1, or 0 for no periodic snapshots";
  TROUPE_USER_CHECK(checkpoint.memory_interval >= 0)
      << "checkpoint.memory_interval = " << checkpoint.memory_interval
      << "; use a number of steps >= 1, or 0 for no snapshots in memory";
  TROUPE_USER_CHECK(checkpoint.max_failures >= 1)
      << "checkpoint.max_failures = " << checkpoint.max_failures << "; use >= 1 (failed snapshots in a row before the "
      << "run stops)";
  TROUPE_USER_CHECK(checkpoint.keep_last >= 1)
      << "checkpoint.keep_last = " << checkpoint.keep_last << "; use >= 1 (the newest complete snapshot is always kept)";
  TROUPE_USER_CHECK(t.hysteresis >= 1) << "train.hysteresis = " << t.hysteresis << "; use >= 1 (default 2)";
  auto& o = optim;
  TROUPE_USER_CHECK(o.lr > 0 && std::isfinite(o.lr)) << "optim.lr = " << o.lr << " must be a positive number";
  TROUPE_USER_CHECK(o.min_lr >= 0 && o.min_lr <= o.lr) << "optim.min_lr = " << o.min_lr
                                                       << " must be between 0 and optim.lr = " << o.lr;
  TROUPE_USER_CHECK(o.warmup_steps >= 0) << "optim.warmup_steps must be >= 0";
  TROUPE_USER_CHECK(o.lr_decay_steps > o.warmup_steps)
      << "optim.lr_decay_steps = " << o.lr_decay_steps << " must exceed optim.warmup_steps = " << o.warmup_steps;
  TROUPE_USER_CHECK(o.weight_decay >= 0) << "optim.weight_decay must be >= 0";
  TROUPE_USER_CHECK(o.grad_clip >= 0 && std::isfinite(o.grad_clip))
      << "optim.grad_clip = " << o.grad_clip << " must be a finite number >= 0 (0 disables clipping)";
  TROUPE_USER_CHECK(o.beta1 >= 0 && o.beta1 < 1) << "optim.beta1 must be in [0, 1)";
  TROUPE_USER_CHECK(o.beta2 >= 0 && o.beta2 < 1) << "optim.beta2 must be in [0, 1)";
  TROUPE_USER_CHECK(o.eps > 0) << "optim.eps must be > 0";
  TROUPE_USER_CHECK(data.val_fraction > 0 && data.val_fraction < 1)
      << "data.val_fraction = " << data.val_fraction << " must be in (0, 1), e.g. 0.05";
  TROUPE_USER_CHECK(!data.corpus.empty()) << "data.corpus is empty; set it to a UTF-8 text file (make data writes data/sotu.txt)";
  TROUPE_USER_CHECK(data.tokenizer_sample_mb >= 1)
      << "data.tokenizer_sample_mb = " << data.tokenizer_sample_mb << "; use at least 1 (MB of text the tokenizer trains on)";
  const int data_threads_max = 8 * (int)std::max(1u, std::thread::hardware_concurrency());
  TROUPE_USER_CHECK(data.threads >= 0 && data.threads <= data_threads_max)
      << "data.threads = " << data.threads << "; use 0 (all cores) to " << data_threads_max
      << " (8 per core: more only slow the tokenizer down)";
  TROUPE_USER_CHECK(!data.cache_dir.empty())
      << "data.cache_dir is empty; set a folder for the tokenizer and token files (default data/cache)";
  std::set<std::string> names;
  for (size_t i = 0; i < data.sources.size(); ++i) {
    const DataSource& s = data.sources[i];
    const std::string at = fmt::format("data.sources[{}]", i);
    TROUPE_USER_CHECK(!s.name.empty() && s.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == std::string::npos)
        << at << " has name = \"" << s.name << "\"; give each source a name of letters, digits, '_' or '-'";
    TROUPE_USER_CHECK(names.insert(s.name).second) << at << ": the name \"" << s.name
                                                   << "\" is used twice; give each source its own name";
    TROUPE_USER_CHECK(!s.path.empty()) << "source '" << s.name << "' has no path; set path = a file or folder";
    TROUPE_USER_CHECK(s.format == "text" || s.format == "jsonl" || s.format == "dir")
        << "source '" << s.name << "' has format = \"" << s.format << "\"; use \"text\", \"jsonl\" or \"dir\"";
    TROUPE_USER_CHECK(s.weight > 0 && std::isfinite(s.weight))
        << "source '" << s.name << "' has weight = " << s.weight
        << "; a weight is the source's share of training samples and must be > 0 (remove the source to leave it out)";
    TROUPE_USER_CHECK(s.utf8 == "refuse" || s.utf8 == "drop" || s.utf8 == "replace")
        << "source '" << s.name << "' has utf8 = \"" << s.utf8 << "\"; use \"refuse\", \"drop\" or \"replace\"";
    TROUPE_USER_CHECK(s.near_threshold > 0 && s.near_threshold <= 1)
        << "source '" << s.name << "' has near_threshold = " << s.near_threshold << "; use a Jaccard similarity in (0, 1], e.g. 0.8";
  }
}

std::vector<std::pair<std::string, std::string>> Config::key_values() const {
  Config c = *this;
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& k : key_table()) {
    std::string v = std::visit(
        [](auto* p) -> std::string {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, std::string>)
            return "\"" + *p + "\"";
          else if constexpr (std::is_same_v<T, double>) {
            return fmt::format("{}", *p);  // shortest form that round-trips
          } else if constexpr (std::is_same_v<T, bool>)
            return *p ? "true" : "false";
          else
            return std::to_string(*p);
        },
        k.ref(c));
    out.emplace_back(k.name, v);
  }
  out.emplace_back("data.sources", sources_text(data.sources));
  return out;
}

std::string Config::to_toml() const {
  Config c = *this;
  toml::table root;
  for (auto& k : key_table()) {
    auto dot = k.name.find('.');
    std::string sec = k.name.substr(0, dot), key = k.name.substr(dot + 1);
    if (!root.contains(sec)) root.insert(sec, toml::table{});
    auto* t = root[sec].as_table();
    std::visit(
        [&](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, uint64_t>)
            t->insert(key, static_cast<int64_t>(*p));
          else
            t->insert(key, *p);
        },
        k.ref(c));
  }
  std::ostringstream os;
  os << root << "\n";
  if (!data.sources.empty()) {  // the blend, as [[data.sources]] tables after the flat keys
    for (const auto& src : data.sources) {
      toml::table t;
      for (auto& [k, ref] : source_keys()) std::visit([&](auto member) { t.insert(k, src.*member); }, ref);
      os << "\n[[data.sources]]\n" << t << "\n";
    }
  }
  return os.str();
}

}  // namespace troupe
