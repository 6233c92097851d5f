#include "core/config.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <functional>
#include <sstream>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>
#include <variant>

#include "core/error.h"
#include "core/read_file.h"
#include "core/text.h"
#include "core/toml_text.h"

namespace troupe {
namespace {
bool has_control(const std::string& s) { return find_control(s) != std::string_view::npos; }

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
      K(data, tokenizer_sample_mb), K(data, special_tokens), K(data, threads), K(data, lock_timeout_s),
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

// A --set key written with TOML quotes (train."steps", 'train'.steps) as the dotted name a
// config file reads it as (train.steps); `name` unchanged when it has no quotes, is no TOML
// key, or a part is not a bare key (a quoted "a.b" stays one part, as in a file).
std::string unquoted_key(const std::string& name) {
  // quotes, or blanks inside the name (train . steps: TOML allows them around the dots; a
  // blank at either end is left to the spaces-around-'=' message)
  const size_t a = name.find_first_not_of(" \t"), b = name.find_last_not_of(" \t");
  const bool inner_blank = a != std::string::npos && name.substr(a, b - a + 1).find_first_of(" \t") != std::string::npos;
  if (name.find_first_of("\"'") == std::string::npos && !(inner_blank && a == 0 && b + 1 == name.size())) return name;
  toml::table t;
  try {
    t = toml::parse(name + " = 0");
  } catch (const std::exception&) {
    return name;
  }
  std::string out;
  const toml::node* n = &t;
  while (const toml::table* tb = n->as_table()) {
    if (tb->size() != 1) return name;
    const std::string part(tb->begin()->first.str());
    if (part.empty() || part.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
                            std::string::npos)
      return name;
    out += (out.empty() ? "" : ".") + part;
    n = &tb->begin()->second;
  }
  return out;
}

// Records `text` when the double it reads as (d) has other digits: more than a double holds.
void note_rounding(Config& c, const std::string& key, std::string_view text, double d) {
  if (reads_as_other_digits(text, d)) c.rounded_reals[key] = {std::string(text), d};
}

// name with its non-ASCII spaces shown as \u{XXXX} (a no-break space prints as a space)
std::string shown_key(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size();) {
    const size_t n = space_at(name, i);
    if (n > 1) {
      const unsigned cp = n == 2 ? 0xA0u
                                 : (((unsigned char)name[i] & 0x0Fu) << 12) | (((unsigned char)name[i + 1] & 0x3Fu) << 6) |
                                       ((unsigned char)name[i + 2] & 0x3Fu);
      out += fmt::format("\\u{{{:04X}}}", cp);
      i += n;
    } else {
      out += name[i++];
    }
  }
  return out;
}

[[noreturn]] void unknown_key(const std::string& name, const std::string& where) {
  // a known key wrapped in spaces (--set ' train.steps = 3 ', a no-break space): say so, not the key list
  size_t a = 0, b = name.size();
  while (a < b && space_at(name, a)) a += space_at(name, a);
  for (bool cut = true; cut && b > a;) {
    cut = false;
    for (size_t n : {size_t(1), size_t(2), size_t(3)})
      if (b >= a + n && space_at(name, b - n) == n) {
        b -= n, cut = true;
        break;
      }
  }
  if ((a > 0 || b < name.size()) && find_key(name.substr(a, b - a))) {
    // space_at takes invisible characters too (U+200B, U+FEFF): call them so (trial 53, F4)
    const std::string cut = name.substr(0, a) + name.substr(b);
    const bool blank = cut.find_first_not_of(" \t") == std::string::npos ||
                       cut.find("\xC2\xA0") != std::string::npos || cut.find("\xE3\x80\x80") != std::string::npos;
    throw UserError("config key '" + shown_key(name) + "'" + where +
                    (blank ? " has spaces around it" : " has an invisible character beside it") +
                    "; write it without them (--set " + name.substr(a, b - a) + "=VALUE)");
  }
  // a look-alike letter (a Cyrillic 'а' in "trаin.steps", pasted from a document): named, as
  // the key prints the same as the one meant
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c0 = (unsigned char)name[i];
    if (c0 < 0x80) continue;
    uint32_t cp = 0;
    const bool valid = valid_utf8_at(name, i, &cp) > 0;
    size_t column = 0;  // characters before it
    for (size_t k = 0; k < i; ++k) column += (((unsigned char)name[k] & 0xC0) != 0x80);
    throw UserError("unknown config key '" + shown_key(printable(name, false, 300)) + "'" + where +
                    ": its character " + std::to_string(column + 1) + " is " +
                    (valid ? fmt::format("U+{:04X}", cp) : fmt::format("the byte 0x{:02X}", c0)) +
                    ", not ASCII (a look-alike letter, pasted?); config keys are ASCII: type the key again");
  }
  std::string sec = name.substr(0, name.find('.'));
  std::string known;
  for (auto& k : key_table())
    if (k.name.rfind(sec + ".", 0) == 0) known += (known.empty() ? "" : ", ") + k.name;
  if (known.empty())
    for (auto& k : key_table()) known += (known.empty() ? "" : ", ") + k.name;
  std::vector<std::string_view> all;  // a misspelling is named (train.stepz -> train.steps)
  for (auto& k : key_table()) all.emplace_back(k.name);
  const std::string near = join(nearest_names(name, all, 2, 3), " or ");
  throw UserError("unknown config key '" + shown_key(printable(name, false, 300)) + "'" + where +
                  (near.empty() ? "; remove it or use one of: " : "; did you mean " + near + "? Otherwise remove it or use one of: ") + known);
}

std::string example(const Ref& r) {
  if (std::holds_alternative<std::string*>(r)) return "\"" + *std::get<std::string*>(r) + "\"";
  if (auto* p = std::get_if<double*>(&r)) return fmt::format("{}", **p);  // shortest exact form
  if (auto* p = std::get_if<int*>(&r)) return std::to_string(**p);
  if (auto* p = std::get_if<bool*>(&r)) return **p ? "true" : "false";
  return std::to_string(*std::get<uint64_t*>(r));
}

// Assigns a TOML value to a key, checking its type. `typed`: the text the user wrote (--set),
// quoted in a refusal instead of the parsed value (1e9 is not "1000000000.0" to its writer).
void assign(Config& c, const Key& k, const toml::node& v, const std::string& where, const std::string* typed = nullptr) {
  Ref r = k.ref(c);
  auto bad = [&](const std::string& want) {  // the value quoted on one short line (an array could be 100,000 lines)
    std::string got;
    if (typed) {
      got = "'" + shown_key(printable(*typed, false, 80)) + "'";  // (a no-break space shows as \u{00A0})
    } else if (const auto* a = v.as_array()) {
      got = "an array of " + std::to_string(a->size()) + " value(s)";
    } else if (v.is_table()) {
      got = "a table";
    } else {
      std::ostringstream os;
      v.visit([&](auto&& n) { os << n; });
      got = printable(os.str(), false, 80);
    }
    // (an empty default shows nothing: the comma-separated list is named for the one list key)
    const std::string eg = k.name == "data.special_tokens" ? std::string("\"<|user|>,<|bot|>\" (one string, the tokens "
                                                                         "separated by commas)")
                                                           : example(k.ref(c));
    throw UserError("config key '" + k.name + "'" + where + " must be " + want + ", got " + got + "; e.g. " + k.name +
                    " = " + eg);
  };
  if (auto* p = std::get_if<int*>(&r)) {
    auto x = v.value<int64_t>();
    // digits TOML would not take (past 64 bits) are still an integer: out of range, not "not one"
    const bool digits = typed && integer_text(*typed);
    if (digits && leading_zero(*typed))
      bad("an integer without leading zeros (TOML does not allow them: write " + without_leading_zeros(*typed) + ")");
    // the type's bound on the side the value lies (the key's own range is checked after: trial 64, F4)
    const auto bound = [](bool negative) {
      return negative ? "a 32-bit integer (at least -2147483648)" : "a 32-bit integer (at most 2147483647)";
    };
    if (!v.is_integer() || !x) bad(digits ? bound(!typed->empty() && (*typed)[0] == '-') : "an integer");
    if (*x < INT32_MIN || *x > INT32_MAX) bad(bound(*x < 0));
    **p = static_cast<int>(*x);
  } else if (auto* p = std::get_if<uint64_t*>(&r)) {
    auto x = v.value<int64_t>();
    const bool digits = typed && integer_text(*typed) && (*typed)[0] != '-';
    if (digits && leading_zero(*typed))
      bad("a non-negative integer without leading zeros (TOML does not allow them: write " + without_leading_zeros(*typed) +
          ")");
    // digits TOML would not take (past 64 bits) are an integer too large, not "not one"
    if (digits && (!v.is_integer() || !x))
      bad("a non-negative integer at most 9223372036854775807 = 0x7FFFFFFFFFFFFFFF (TOML's integers are 64-bit)");
    if (!v.is_integer() || !x || *x < 0) bad("a non-negative integer");
    **p = static_cast<uint64_t>(*x);
  } else if (auto* p = std::get_if<double*>(&r)) {
    if (typed && leading_zero(*typed))
      bad("a number without leading zeros (TOML does not allow them: write " + without_leading_zeros(*typed) + ")");
    if (!v.is_number()) bad("a number");
    // an integer converts as a number (toml++'s value<double>() gave nonsense, 1e-312, for one
    // past 2^53 that no double holds exactly: trial 41); the range checks then see its size
    **p = v.is_integer() ? static_cast<double>(*v.value<int64_t>()) : *v.value<double>();
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
  TROUPE_USER_CHECK(!arr->empty()) << "data.sources in " << path
                                   << " is an empty list; add a [[data.sources]] table per source, or remove the "
                                      "key to train on data.corpus";
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
        std::vector<std::string_view> names;
        for (auto& e : source_keys()) known += (known.empty() ? "" : ", ") + e.first, names.emplace_back(e.first);
        const std::string near = join(nearest_names(k, names, 2, 3), " or ");
        throw UserError("unknown key '" + printable(k, false, 300) + "' in " + where +
                        (near.empty() ? "; use one of: " : "; did you mean " + near + "? Otherwise use one of: ") + known);
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
            if constexpr (std::is_same_v<T, std::string>) {
              TROUPE_USER_CHECK(!has_control(*v)) << where << " key '" << k
                                                  << "' holds a control character (NUL, a newline, an escape, ...); "
                                                     "write the value without it";
            }
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

bool builtin_schedule(std::string_view name) {
  return name == "gpipe" || name == "1f1b" || name == "interleaved" || name == "zb-h1";
}

std::vector<std::string> Config::keys() {
  std::vector<std::string> out;
  for (auto& k : key_table()) out.push_back(k.name);
  return out;
}

Config Config::load(const std::string& path) {
  std::error_code ec;
  TROUPE_USER_CHECK(std::filesystem::is_regular_file(path, ec))
      << "config file '" << path << "' "
      << (std::filesystem::exists(path, ec) ? "is not a regular file;" : missing_reason(path))
      << " pass a TOML file to --config (e.g. configs/sotu.toml)";
  TROUPE_USER_CHECK(std::filesystem::file_size(path, ec) <= (16u << 20))
      << "config file '" << path << "' has " << std::filesystem::file_size(path, ec)
      << " bytes, more than the 16 MiB a config may have; pass a TOML config to --config (e.g. configs/sotu.toml)";
  // (a read that fails, /proc/self/mem's EIO, is named: an istream would read it as empty)
  std::stringstream text(read_file_checked(path, "config file", "pass a readable TOML file to --config (e.g. "
                                                                "configs/sotu.toml)"));
  // a binary file (a snapshot's manifest.capnp, a .safetensors) would fail in TOML's terms
  if (const char* wide = wide_encoding(text.str()); *wide)
    TROUPE_USER_FAIL() << "config file '" << path << "' is " << wide << " text; TOML is UTF-8: convert it (iconv -f "
                       << wide << " -t UTF-8 '" << path << "' > config.toml) and pass that to --config";
  TROUPE_USER_CHECK(text.str().find('\0') == std::string::npos)
      << "config file '" << path << "' is not text (it holds NUL bytes: a binary file?); pass a TOML config to --config "
      << "(e.g. configs/sotu.toml)";
  // a JSON file (generate --logits-out, a metrics line): named before TOML's checks misread it
  // (its numbers' dots as key parts). nlohmann's parser keeps its own stack: no recursion.
  if (const size_t first = text.str().find_first_not_of(" \t\r\n"); first != std::string::npos &&
      (text.str()[first] == '{' || text.str()[first] == '[') && nlohmann::json::accept(text.str()))
    TROUPE_USER_FAIL() << "config file '" << path << "' is JSON, not TOML; pass a TOML config to --config (e.g. "
                       << "configs/sotu.toml: [section] headers, then key = value lines)";
  Config c = parse(text.str(), path);
  // an empty file (or comments, or bare [section] headers) would train the default job
  // without a word: the wrong file, or one cut short
  bool any = false;
  for (auto&& [sec, node] : toml::parse(text.str(), path))
    any = any || !node.is_table() || !node.as_table()->empty();
  TROUPE_USER_CHECK(any) << "config file '" << path << "' sets no key (it is empty, or holds only comments or section "
                         << "headers); pass the config you meant, or copy configs/sotu.toml (the default job) or "
                         << "configs/tiny.toml and edit it";
  return c;
}

Config Config::parse(const std::string& text, const std::string& path) {
  check_toml_nesting(text, "config file '" + path + "'");
  toml::table tbl;
  try {
    tbl = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw UserError(toml_error_sentence(text, path, e.source().begin.line, parser_message(e.description())));
  }
  Config c;
  std::string where = " in " + path;
  for (auto&& [sec, node] : tbl) {
    auto* t = node.as_table();
    if (!t && find_key(std::string(sec.str())))  // "model.n_layer" = 2: one quoted key, not n_layer of [model]
      throw UserError("config key \"" + std::string(sec.str()) + "\"" + where +
                      " is quoted, so TOML reads it as one top-level key whose name holds a dot, not as a key of a "
                      "section; write it without the quotes (" + std::string(sec.str()) + " = ...)");
    if (!t) {
      const std::string name(sec.str());
      bool section = false;  // [[model]] or model = 5 where [model] belongs: the key is known, its form is not
      for (auto& k : key_table()) section = section || k.name.rfind(name + ".", 0) == 0;
      if (section || name == "data")
        throw UserError("'" + name + "'" + where + " is " +
                        (node.is_array_of_tables() ? "an array of tables ([[" + name + "]])"
                         : node.is_array()         ? "an array"
                                                   : "a single value") +
                        ", but troupe reads it as one table; write one [" + name + "] header with its keys under it (" +
                        (name == "data" ? "sources go in [[data.sources]]" : "e.g. [" + name + "] then key = value lines") + ")");
      unknown_key(name, where);
    }
    for (auto&& [key, val] : *t) {
      std::string name = std::string(sec.str()) + "." + std::string(key.str());
      if (name == "data.sources") {
        c.data.sources = parse_sources(val, path);
        continue;
      }
      const Key* k = find_key(name);
      if (!k) unknown_key(name, where);
      assign(c, *k, val, where);
      if (const auto* d = val.as_floating_point())
        note_rounding(c, name, token_at(text, val.source().begin.line, val.source().begin.column), d->get());
    }
  }
  return c;
}

void Config::set(const std::string& assignment) {
  auto eq = assignment.find('=');
  TROUPE_USER_CHECK(eq != std::string::npos && eq > 0)
      << "--set '" << assignment << "' must look like section.key=value (e.g. --set train.steps=10)";
  // train."steps"=1 names train.steps, as it would in a file
  std::string name = unquoted_key(assignment.substr(0, eq)), value = assignment.substr(eq + 1);
  TROUPE_USER_CHECK(name.rfind("data.sources", 0) != 0)
      << "--set cannot change data.sources; edit the [[data.sources]] tables of the config file";
  const Key* k = find_key(name);
  if (!k) {
    // 'model.n_layer = 4' as one shell word: the name keeps the spaces
    const std::string trimmed = name.substr(0, name.find_last_not_of(" \t") + 1);
    const size_t v0 = std::min(value.size(), value.find_first_not_of(" \t"));
    TROUPE_USER_CHECK(trimmed == name || find_key(trimmed) == nullptr)
        << "--set '" << printable(assignment, false, 120) << "' has spaces around '='; write it without them: --set "
        << trimmed << "=" << printable(value.substr(v0), false, 80);
    unknown_key(name, " (from --set)");
  }
  TROUPE_USER_CHECK(name != "data.corpus" || data.sources.empty())
      << "--set data.corpus: this config trains on its [[data.sources]], which data.corpus does not change; edit the "
      << "sources in the config file, or use a config without [[data.sources]]";
  // 1e-400 reads as 0 (in TOML's parser and strtod alike): the check of the key would then
  // quote a 0 nobody typed
  if (std::holds_alternative<double*>(k->ref(*this)) && !value.empty() && !std::isspace((unsigned char)value[0])) {
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(value.c_str(), &end);
    const bool whole = end == value.c_str() + value.size() && errno == ERANGE;
    TROUPE_USER_CHECK(!(whole && d == 0))
        << "config key '" << name << "' (from --set) = " << printable(value, false, 80)
        << " is below the smallest number a double holds (about 4.9e-324); use a larger value";
    TROUPE_USER_CHECK(!(whole && std::isinf(d)))
        << "config key '" << name << "' (from --set) = " << printable(value, false, 80)
        << " is beyond the largest number a double holds (about 1.8e308); use a smaller value";
  }
  // Parse the value as TOML; a bare word is taken as a string.
  toml::table t;
  check_toml_nesting("v = " + value, "--set " + name, true);
  try {
    t = toml::parse("v = " + value);
  } catch (const toml::parse_error& e) {
    // a value that opens a TOML array or inline table is TOML with a mistake, not a word
    const size_t first = value.find_first_not_of(" \t");
    // (and one that opens a TOML string: its quotes or escapes are wrong, or the quotes would
    // end up in the value)
    TROUPE_USER_CHECK(first == std::string::npos ||
                      (value[first] != '[' && value[first] != '{' && value[first] != '"' && value[first] != '\''))
        << "--set " << name << "=" << printable(value, false, 80) << " is not valid TOML ("
        << printable(std::string(e.description()), false, 120) << "); fix it"
        << (std::holds_alternative<std::string*>(k->ref(*this))
                ? (value[first] == '"' || value[first] == '\''
                       ? (text_after_quotes(value, first)
                              ? std::string(" (text follows the closing quote: quote the whole value, or leave the "
                                            "quotes out for a plain word)")
                              : std::string(" (close the quotes; a backslash in \"...\" starts an escape: use '...' "
                                            "for text with backslashes), or leave the quotes out for a plain word"))
                       : std::string(", or quote a string that starts with '") + value[first] + "': --set '" + name +
                             "=\"...\"'")
                : std::string());
    t = toml::table{};
    t.insert("v", value);
  }
  // a bare word for a string key is that string; an array or inline table is TOML that
  // means something else (data.special_tokens=["<a>"] would train a token named ["<a>"]):
  // assign() refuses it by its type
  if (std::holds_alternative<std::string*>(k->ref(*this)) && !t["v"].is_string() && !t["v"].is_array() &&
      !t["v"].is_table()) {
    t = toml::table{};
    t.insert("v", value);
  }
  // a decimal TOML's parser will not take (hundreds of digits, 1e-320) is still a number
  // (decimal only: strtod also reads hex floats such as 0x1p-3, which a TOML file may not hold)
  if (std::holds_alternative<double*>(k->ref(*this)) && !t["v"].is_number() && !value.empty() &&
      value.find_first_not_of("0123456789+-.eE") == std::string::npos) {
    char* end = nullptr;
    const double d = std::strtod(value.c_str(), &end);
    if (end == value.c_str() + value.size() && std::isfinite(d)) {
      t = toml::table{};
      t.insert("v", d);
    }
  }
  assign(*this, *k, *t["v"].node(), " (from --set)", &value);
  rounded_reals.erase(name);
  if (const auto* d = t["v"].node()->as_floating_point()) note_rounding(*this, name, value, d->get());
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
    if (k.name == "data.corpus" && !data.sources.empty()) continue;  // the blend's sources replace it
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
