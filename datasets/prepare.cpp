// datasets/prepare.cpp — see prepare.h.
#include "datasets/prepare.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/job_error.h"
#include "core/text.h"
#include <optional>
#include "datasets/cache_folder.h"
#include "datasets/pipeline.h"
#include "datasets/sources.h"
#include "datasets/token_file.h"
#include "datasets/tokenizer.h"

namespace troupe {

namespace fs = std::filesystem;

namespace {

// Bump when the meaning of the cached files changes (how documents are joined, ...).
constexpr int kCacheFormat = 2;

std::string fmt_mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

}  // namespace

std::vector<int32_t> tokenize_documents(const Tokenizer& tok, const std::vector<std::string>& docs,
                                        int threads, const DataLogFn& log, const std::string& what) {
  const size_t n = docs.size();
  uint64_t total_bytes = 0;
  for (const auto& d : docs) total_bytes += d.size();
  unsigned nt = threads > 0 ? static_cast<unsigned>(threads)
                            : std::min(8u, std::max(1u, std::thread::hardware_concurrency()));
  nt = static_cast<unsigned>(std::min<size_t>(nt, std::max<size_t>(n, 1)));

  std::vector<std::vector<int32_t>> out(n);
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done_bytes{0};
  std::mutex log_mutex;
  int next_decile = 1;  // guarded by log_mutex
  std::exception_ptr error;
  std::mutex error_mutex;

  auto work = [&] {
    try {
      for (size_t i; (i = next.fetch_add(1)) < n;) {
        out[i] = tok.encode(docs[i]);
        const uint64_t done = done_bytes.fetch_add(docs[i].size()) + docs[i].size();
        if (log && total_bytes > 0) {
          std::lock_guard<std::mutex> lock(log_mutex);
          const int decile = static_cast<int>(done * 10 / total_bytes);
          if (decile >= next_decile) {
            next_decile = decile + 1;
            log("tokenizing " + what + ": " + std::to_string(decile * 10) + "% (" +
                fmt_mb(done) + " of " + fmt_mb(total_bytes) + ")");
          }
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(n);  // stop the others
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < nt; ++t) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {  // no thread left (ulimit -u, a cgroup's pids.max): the
      break;                              // started ones share the work, by index: the same result
    }
  }
  work();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);

  size_t total = n;
  for (const auto& v : out) total += v.size();
  std::vector<int32_t> tokens;
  tokens.reserve(total);
  for (auto& v : out) {
    tokens.insert(tokens.end(), v.begin(), v.end());
    tokens.push_back(tok.eot_id());
    std::vector<int32_t>().swap(v);
  }
  return tokens;
}

double unigram_cross_entropy(std::span<const uint64_t> train_counts,
                             std::span<const uint64_t> val_counts) {
  TROUPE_CHECK(train_counts.size() == val_counts.size() && !train_counts.empty())
      << "count vectors of sizes " << train_counts.size() << " and " << val_counts.size();
  const auto v = static_cast<double>(train_counts.size());
  double n = 0.0, m = 0.0;
  for (uint64_t c : train_counts) n += static_cast<double>(c);
  for (uint64_t c : val_counts) m += static_cast<double>(c);
  TROUPE_CHECK(m > 0) << "no validation tokens";
  const double log_denom = std::log(n + v);
  double sum = 0.0;  // sum over val tokens of -ln p
  for (size_t i = 0; i < train_counts.size(); ++i) {
    if (val_counts[i] == 0) continue;
    const double logp = std::log(static_cast<double>(train_counts[i]) + 1.0) - log_denom;
    sum -= static_cast<double>(val_counts[i]) * logp;
  }
  return sum / m;
}

double unigram_cross_entropy(std::span<const int32_t> train_tokens,
                             std::span<const int32_t> val_tokens, int vocab_size) {
  TROUPE_CHECK(vocab_size > 0) << "vocab_size " << vocab_size;
  std::vector<uint64_t> tc(static_cast<size_t>(vocab_size), 0), vc(tc.size(), 0);
  auto count = [&](std::span<const int32_t> toks, std::vector<uint64_t>& c) {
    for (int32_t t : toks) {
      TROUPE_CHECK(t >= 0 && t < vocab_size) << "token " << t << " outside [0, " << vocab_size << ")";
      ++c[static_cast<size_t>(t)];
    }
  };
  count(train_tokens, tc);
  count(val_tokens, vc);
  return unigram_cross_entropy(tc, vc);
}

// ---- prepare_data: the key, reuse, build, commit -------------------------------------

namespace {

// What the cache folder is made from (everything but the weights); its hash names the folder.
nlohmann::json cache_key(const DataConfig& cfg, int vocab_size, const std::vector<DataSource>& blend,
                         const std::vector<std::string>& special, const std::string& user_tokenizer_hash,
                         const DataLogFn& log) {
  nlohmann::json sources = nlohmann::json::array();
  for (const DataSource& s : blend)
    sources.push_back({{"name", s.name}, {"format", s.format}, {"field", s.field}, {"glob", s.glob},
                       {"bytes_hash", hash_hex(source_fingerprint(s, log))}, {"utf8", s.utf8}, {"normalize", s.normalize},
                       {"dedup", s.dedup}, {"near_dedup", s.near_dedup}, {"near_threshold", s.near_threshold},
                       {"quality", s.quality}});
  return {{"format", kCacheFormat},
          {"vocab_size", vocab_size},
          {"val_fraction", cfg.val_fraction},
          {"tokenizer", user_tokenizer_hash.empty() ? std::string("trained") : user_tokenizer_hash},
          {"tokenizer_sample_mb", user_tokenizer_hash.empty() ? cfg.tokenizer_sample_mb : 0},
          {"special_tokens", special},
          {"sources", sources}};
}

void set_paths(PreparedData& p, const std::vector<DataSource>& blend) {
  using namespace cache_files;
  p.tokenizer_path = p.dir + "/" + kTokenizer;
  p.report_path = p.dir + "/" + kReport;
  p.removed_path = p.dir + "/" + kRemoved;
  p.sources.clear();
  for (const DataSource& s : blend) {
    PreparedSource ps;
    ps.name = s.name;
    ps.weight = s.weight;
    ps.train_path = p.dir + "/" + s.name + kTrainBin;
    ps.val_path = p.dir + "/" + s.name + kValBin;
    ps.train_idx = p.dir + "/" + s.name + kTrainIdx;
    ps.val_idx = p.dir + "/" + s.name + kValIdx;
    p.sources.push_back(ps);
  }
}

nlohmann::json source_report_json(const SourceReport& r) {
  nlohmann::json filtered = nlohmann::json::object();
  for (int f = 0; f < kNumQualityFilters; ++f) filtered[kQualityFilters[f]] = r.filtered[static_cast<size_t>(f)];
  return {{"name", r.name}, {"docs_in", r.docs_in}, {"bytes_in", r.bytes_in},
          {"invalid_utf8_bytes", r.invalid_utf8_bytes}, {"normalized", r.normalized},
          {"exact_duplicates", r.exact_duplicates}, {"near_duplicates", r.near_duplicates},
          {"filtered", filtered}, {"docs_kept", r.docs_kept}, {"bytes_kept", r.bytes_kept}};
}

SourceReport source_report_from(const nlohmann::json& j) {
  SourceReport r;
  r.name = j.at("name").get<std::string>();
  for (auto [k, v] : {std::pair<const char*, uint64_t*>{"docs_in", &r.docs_in}, {"bytes_in", &r.bytes_in},
                      {"invalid_utf8_bytes", &r.invalid_utf8_bytes}, {"normalized", &r.normalized},
                      {"exact_duplicates", &r.exact_duplicates}, {"near_duplicates", &r.near_duplicates},
                      {"docs_kept", &r.docs_kept}, {"bytes_kept", &r.bytes_kept}})
    *v = j.at(k).get<uint64_t>();
  for (int f = 0; f < kNumQualityFilters; ++f)
    r.filtered[static_cast<size_t>(f)] = j.at("filtered").at(kQualityFilters[f]).get<uint64_t>();
  return r;
}

// Why the committed folder cannot be reused ("" = it can), filling p from meta.json.
std::string check_committed(PreparedData& p, const nlohmann::json& key, int vocab_size) {
  nlohmann::json meta;
  // a FIFO (or a device) in a file's place would block the read below with no deadline
  std::vector<std::string> files = {p.dir + "/" + cache_files::kMeta, p.tokenizer_path};
  for (const PreparedSource& s : p.sources) files.insert(files.end(), {s.train_path, s.val_path, s.train_idx, s.val_idx});
  for (const std::string& f : files) {
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(f, ec))) return fs::path(f).filename().string() + " is missing";
    if (!fs::is_regular_file(f, ec))
      return fs::path(f).filename().string() + " is not a regular file (a FIFO, a device, a folder or a broken link)";
  }
  try {
    std::ifstream in(p.dir + "/" + cache_files::kMeta);
    meta = nlohmann::json::parse(in);
    if (meta.at("key") != key) return "meta.json was made from other inputs";
    const Tokenizer tok = Tokenizer::load(p.tokenizer_path);
    if (hash_hex(tok.hash()) != meta.at("tokenizer_hash").get<std::string>() || tok.vocab_size() != vocab_size)
      return "tokenizer.model is not the tokenizer the token files were made with (another blend's?)";
    p.tokenizer_hash = tok.hash();
    p.eot_id = tok.eot_id();
    for (size_t i = 0; i < p.sources.size(); ++i) {
      PreparedSource& s = p.sources[i];
      const auto& m = meta.at("sources").at(i);
      s.report = source_report_from(m.at("report"));
      for (int split = 0; split < 2; ++split) {
        const std::string& bin = split == 0 ? s.train_path : s.val_path;
        const TokenFile f(bin);
        const DocIndex idx = read_doc_index(split == 0 ? s.train_idx : s.val_idx);
        f.check_tokenizer(tok.hash());
        TROUPE_USER_CHECK(idx.tokenizer_hash == tok.hash())
            << "document index '" << (split == 0 ? s.train_idx : s.val_idx) << "' was written with tokenizer "
            << hash_hex(idx.tokenizer_hash) << ", not " << hash_hex(tok.hash());
        if (idx.vocab_size != vocab_size)
          return fs::path(split == 0 ? s.train_idx : s.val_idx).filename().string() + " records vocab_size " +
                 std::to_string(idx.vocab_size) + ", not the " + std::to_string(vocab_size) + " of its tokenizer";
        const uint64_t want = m.at(split == 0 ? "train_tokens" : "val_tokens").get<uint64_t>();
        if (f.size() != want || idx.tokens() != want)
          return fs::path(bin).filename().string() + " does not hold the " + std::to_string(want) +
                 " tokens meta.json records";
        f.validate(vocab_size);
        // every document ends with the end-of-text token: a boundary elsewhere is a changed index
        for (size_t d = 1; d < idx.offsets.size(); ++d)
          if (f[idx.offsets[d] - 1] != p.eot_id)
            return fs::path(split == 0 ? s.train_idx : s.val_idx).filename().string() + " puts the end of document " +
                   std::to_string(d) + " at token " + std::to_string(idx.offsets[d]) +
                   ", where the token file holds no end-of-text token";
        // (caches written before the checksum was recorded have none: they are read as before)
        if (const char* sum_key = split == 0 ? "train_checksum" : "val_checksum"; m.contains(sum_key))
          if (m.at(sum_key).get<std::string>() != hash_hex(f.checksum()))
            return fs::path(bin).filename().string() +
                   " does not match the checksum meta.json records: it was changed after it was written";
        (split == 0 ? s.train_tokens : s.val_tokens) = want;
        (split == 0 ? s.train_docs : s.val_docs) = idx.docs();
      }
    }
    p.unigram_entropy = meta.at("unigram_entropy").get<double>();
    p.tokenizer_sample_bytes = meta.at("tokenizer_sample_bytes").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {  // its what() starts "[json.exception.parse_error.101] "
    return "meta.json is not what troupe writes (" + parser_message(e.what()) + ")";
  } catch (const std::exception& e) {
    // the problem only: its fix (e.g. "point data.tokenizer at …") is not this folder's, whose
    // fix the caller names (delete the folder to rebuild it)
    const std::string what = e.what();
    return what.substr(0, what.find("; "));
  }
  return "";
}

// A source that holds fewer than 2 documents as read: throws UserError saying how its kind
// separates documents, and naming line ends of CR alone (old Mac files: one line to the reader).
[[noreturn]] void few_documents(const DataSource& s, uint64_t docs) {
  std::string cr;
  std::error_code ec;
  if (std::filesystem::is_regular_file(s.path, ec)) {
    std::ifstream in(s.path, std::ios::binary);
    std::string head(65536, '\0');
    in.read(head.data(), (std::streamsize)head.size());
    head.resize((size_t)in.gcount());
    if (head.find('\r') != std::string::npos && head.find('\n') == std::string::npos)
      cr = "; its lines end in CR alone (old Mac line ends), which reads as one line: convert them (tr '\\r' '\\n' < " +
           s.path + " > converted.txt) and point the source at the result";
  }
  const std::string how = s.format == "jsonl" ? "one JSON object per line"
                          : s.format == "dir" ? "one file per document"
                                            : "documents separated by a blank line";
  throw UserError("source '" + s.name + "' holds " + std::to_string(docs) + " document(s) (" + how +
                  "), but a train and a validation split need at least 2" + (cr.empty() ? "; add documents" : cr));
}

// Pass 1 over every source, the tokenizer, pass 2; fills p (not its unigram entropy).
void build(PreparedData& p, const DataConfig& cfg, const std::vector<DataSource>& blend,
           const std::vector<std::string>& special, int vocab_size, const DataLogFn& log) {
  const int threads = resolve_threads(cfg.threads);
  uint64_t total = 0;
  for (const DataSource& s : blend) total += source_bytes(s);
  const double rate = static_cast<double>(cfg.tokenizer_sample_mb) * 1e6 / std::max<double>(1.0, static_cast<double>(total));
  std::vector<std::string> sample;
  std::vector<uint64_t> n_train(blend.size());
  std::string removed;
  for (size_t i = 0; i < blend.size(); ++i) {
    CleanOutput c = clean_source(blend[i], p.dir + "/" + blend[i].name + cache_files::kScratch, threads, rate, log);
    const uint64_t n = c.report.docs_kept;
    if (c.report.docs_in < 2) few_documents(blend[i], c.report.docs_in);  // nothing to blame on the cleaning
    TROUPE_USER_CHECK(n >= 2) << "source '" << blend[i].name << "' keeps " << n << " document(s) after cleaning ("
                              << c.report.docs_in << " read), but a train and a validation split need at least 2; "
                              << "add documents, or turn off the cleaning steps that removed them (the source's "
                              << "dedup, near_dedup, quality or utf8 keys; docs/data.md)";
    const auto n_val = std::clamp<uint64_t>(static_cast<uint64_t>(std::llround(cfg.val_fraction * static_cast<double>(n))), 1, n - 1);
    n_train[i] = n - n_val;
    for (auto& d : c.sample)
      if (d.index < n_train[i]) sample.push_back(std::move(d.text));
    for (const auto& r : c.removed)
      removed += nlohmann::json{{"source", r.source}, {"reason", r.reason}, {"file", r.file}, {"line", r.line},
                                {"text", r.text}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    p.sources[i].report = std::move(c.report);
  }
  if (cfg.tokenizer.empty()) {
    for (const auto& d : sample) p.tokenizer_sample_bytes += d.size();
    Tokenizer::train(sample, vocab_size, p.dir + "/tokenizer", log, special);
  } else {
    write_file_atomic(p.tokenizer_path, read_file_bytes(cfg.tokenizer, "tokenizer model"));
  }
  std::vector<std::string>().swap(sample);
  const Tokenizer tok = Tokenizer::load(p.tokenizer_path);
  TROUPE_CHECK(tok.vocab_size() == vocab_size) << "tokenizer has " << tok.vocab_size() << " pieces";
  p.tokenizer_hash = tok.hash();
  p.eot_id = tok.eot_id();
  for (size_t i = 0; i < blend.size(); ++i) {
    PreparedSource& s = p.sources[i];
    const std::string scratch = p.dir + "/" + s.name + cache_files::kScratch;
    TokenFileWriter train(s.train_path, s.train_idx, vocab_size, tok.hash());
    TokenFileWriter val(s.val_path, s.val_idx, vocab_size, tok.hash());
    tokenize_scratch(tok, scratch, n_train[i], train, val, threads, s.name, log);
    train.commit();
    val.commit();
    s.train_docs = train.docs(), s.val_docs = val.docs();
    s.train_tokens = train.tokens(), s.val_tokens = val.tokens();
    std::error_code ec;
    fs::remove(scratch, ec);
  }
  write_file_atomic(p.removed_path, removed);
}

// A fresh build's last work: the blend's unigram entropy (all train tokens against all val
// tokens), each token file's checksum, report.json, and meta.json, written last (the commit).
void commit(PreparedData& p, const nlohmann::json& key, const std::vector<std::string>& special, int vocab_size) {
  std::vector<uint64_t> tc(static_cast<size_t>(vocab_size), 0), vc(tc.size(), 0);
  nlohmann::json sources = nlohmann::json::array();
  for (const PreparedSource& s : p.sources) {
    const TokenFile train(s.train_path), val(s.val_path);
    const auto a = train.counts(vocab_size), b = val.counts(vocab_size);
    for (size_t v = 0; v < tc.size(); ++v) tc[v] += a[v], vc[v] += b[v];
    sources.push_back({{"name", s.name}, {"train_tokens", s.train_tokens}, {"val_tokens", s.val_tokens},
                       {"train_checksum", hash_hex(train.checksum())}, {"val_checksum", hash_hex(val.checksum())},
                       {"report", source_report_json(s.report)}});
  }
  p.unigram_entropy = unigram_cross_entropy(tc, vc);
  write_file_atomic(p.report_path, report_json(p, special));
  const nlohmann::json meta = {{"key", key},
                               {"tokenizer_hash", hash_hex(p.tokenizer_hash)},
                               {"tokenizer_sample_bytes", p.tokenizer_sample_bytes},
                               {"eot_id", p.eot_id},
                               {"unigram_entropy", p.unigram_entropy},
                               {"sources", sources}};
  write_file_atomic(p.dir + "/" + cache_files::kMeta, meta.dump(2) + "\n");  // the commit
}

}  // namespace

PreparedData prepare_data(const DataConfig& cfg, int vocab_size, const DataLogFn& log) {
  auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  // (a floor, not the number: the corpus's characters come on top; trial 62, M3)
  TROUPE_USER_CHECK(vocab_size >= Tokenizer::kMinVocabSize)
      << "model.vocab_size = " << vocab_size << " is too small: the tokenizer needs more than "
      << Tokenizer::kMinVocabSize << " (2 special + 256 byte pieces, + one per distinct character of the corpus, "
      << "named once the corpus is read): use 512 or more";
  const std::vector<DataSource> blend = cfg.blend();
  const std::vector<std::string> special = parse_special_tokens(cfg.special_tokens);
  std::string user_hash;
  if (!cfg.tokenizer.empty()) {
    const Tokenizer user = Tokenizer::load(cfg.tokenizer);
    TROUPE_USER_CHECK(user.vocab_size() == vocab_size)
        << "data.tokenizer '" << cfg.tokenizer << "' has " << user.vocab_size()
        << " pieces but model.vocab_size = " << vocab_size << "; set model.vocab_size = "
        << user.vocab_size() << ", or leave data.tokenizer empty to train a tokenizer of "
        << vocab_size << " pieces";
    // a given tokenizer is used as it is: data.special_tokens only shapes one troupe trains
    for (const std::string& t : special) {
      const std::vector<int32_t> ids = user.encode(t);
      TROUPE_USER_CHECK(ids.size() == 1 && user.piece(ids[0]) == t)
          << "data.special_tokens lists \"" << printable(t, false, 60) << "\", which data.tokenizer '" << cfg.tokenizer
          << "' does not hold as one piece (it encodes to " << ids.size() << " pieces): a given tokenizer is used as it "
          << "is; train one with that token (leave data.tokenizer empty), or remove it from data.special_tokens";
    }
    user_hash = hash_hex(user.hash());
  }
  const nlohmann::json key = cache_key(cfg, vocab_size, blend, special, user_hash, log);
  PreparedData p;
  p.vocab_size = vocab_size;
  p.key = hash_hex(fnv1a64(key.dump()));
  p.dir = (fs::path(cfg.cache_dir) / (p.key + "-v" + std::to_string(vocab_size))).string();
  // a link in the cache folder's place would send every write (and a rebuild's removals) to
  // the folder it points to: a user's files there would be replaced
  if (std::error_code lec; fs::is_symlink(p.dir, lec))
    TROUPE_USER_FAIL() << "the data cache folder " << p.dir << " is a symbolic link (to "
                       << fs::read_symlink(p.dir, lec).string() << "); troupe writes its cache folders itself, not "
                       << "through links: remove the link, or point data.cache_dir at the folder you meant";
  set_paths(p, blend);
  auto add_up = [&p] {
    for (const PreparedSource& s : p.sources) {
      p.train_docs += s.train_docs, p.val_docs += s.val_docs;
      p.train_tokens += s.train_tokens, p.val_tokens += s.val_tokens;
    }
  };
  auto summary = [&] {
    char line[256];
    std::snprintf(line, sizeof line,
                  "data: %zu source(s), %zu train docs -> %llu tokens, %zu val docs -> %llu tokens, vocab %d, "
                  "unigram entropy %.4f nats/token",
                  p.sources.size(), p.train_docs, static_cast<unsigned long long>(p.train_tokens), p.val_docs,
                  static_cast<unsigned long long>(p.val_tokens), vocab_size, p.unigram_entropy);
    say(line);
  };
  // A complete cache in a folder no process can change (a read-only dataset mount: EROFS even
  // for root, or another user's folder) is checked and used without its lock, which it could
  // not take: nobody prepares or rebuilds it there.
  if (std::error_code rec; fs::exists(p.dir + "/" + cache_files::kMeta, rec) && ::access(p.dir.c_str(), W_OK) != 0) {
    const std::string problem = check_committed(p, key, vocab_size);
    if (!problem.empty())
      throw UserError("the data cache " + p.dir + " (read-only here) is damaged: " + problem +
                      "; prepare it again where it can be written (data.cache_dir) and copy it back");
    say("data: reusing " + p.dir + " (read-only: used without its lock)");
    p.from_cache = true;
    add_up();
    summary();
    return p;
  }
  // The folder and those above it that are missing; a preparation stopped or failing removes
  // them again (datasets/cache_folder.h), and what it wrote: no empty cache/<hash>-v<V>/ stays.
  // a stop signal that came before this point (troupe train takes them before the guard
  // below): nothing is made (the key above may have read every source for a while)
  if (const int sig = noted_stop_signal(); sig != 0)
    throw UserError(std::string("stopped by ") + stop_signal_label(sig) + " before the data in " + p.dir +
                    " was prepared; nothing was changed");
  const std::string made_here = make_cache_folder(p.dir);
  // Ctrl-C / SIGTERM from here to the commit: remove what this preparation wrote, say so,
  // exit 2 (the default action left .lock, <source>.scratch and a partial tokenizer).
  enum Phase { kWaiting, kReading, kBuilding, kCommitted };
  std::atomic<int> phase{kWaiting};
  std::atomic<bool> stopping{false};
  std::optional<InterruptGuard> interrupt;
  try {  // (its watcher thread may be refused: then the folders made above go, trial 40)
    interrupt.emplace([&](int sig) {
      const std::string what = stop_signal_label(sig);
      std::error_code ec;
      if (phase == kWaiting) {
        remove_made_if_empty(p.dir, made_here);  // the folders it made, unless the one it waits for still uses them
        return "stopped by " + what + " while waiting for another process preparing " + p.dir + "; nothing was changed";
      }
      if (phase == kReading || phase == kCommitted) {
        fs::remove(p.dir + "/.lock", ec);  // this process holds it
        return "stopped by " + what + (phase == kReading ? " while reading the data cache " : " after preparing the data cache ") +
               p.dir + (phase == kReading ? "; nothing was changed" : "; it is complete");
      }
      stopping = true;  // the preparing thread may now fail for want of its folder: it waits for the exit
      const bool clean = remove_stopped(p.dir, made_here);
      return "stopped by " + what + " while preparing the data in " + p.dir +
             (clean ? "; its partial files were removed (nothing else was touched): run the command again to prepare it"
                    : "; its partial files could not all be removed: delete that folder, then run the command again");
    });
  } catch (...) {
    remove_made_if_empty(p.dir, made_here);
    throw;
  }
  std::optional<CacheLock> lock;
  for (int attempt = 1;; ++attempt) try {
      lock.emplace(p.dir, log, cfg.lock_timeout_s);
      break;
    } catch (const CacheFolderRemoved&) {
      // the process it waited for ended without finishing (stopped, say): this one prepares the
      // folder instead, made again (trial 55); a third removal in a row is said
      if (attempt >= 3 || noted_stop_signal() != 0) {
        remove_made_if_empty(p.dir, made_here);
        throw;
      }
      say("data: the process preparing " + p.dir + " ended without finishing it; this process prepares it");
      make_cache_folder(p.dir);  // (the folders it makes are in .made, which a stopped build removes)
    } catch (...) {
      remove_made_if_empty(p.dir, made_here);
      throw;
    }
  phase = kReading;
  if (fs::exists(p.dir + "/" + cache_files::kMeta)) {
    const std::string problem = check_committed(p, key, vocab_size);
    // A committed cache whose files do not match its meta.json was damaged after it was
    // written: refuse (naming the file) rather than silently rewrite what is there.
    if (!problem.empty())
      throw UserError("the data cache " + p.dir + " is damaged: " + problem +
                      (problem.find("delete") == std::string::npos ? "; delete that folder to rebuild it" : ""));
    say("data: reusing " + p.dir);
    p.from_cache = true;
    add_up();
  } else {
    say("data: preparing " + p.dir + " from " + std::to_string(blend.size()) + " source(s)");
    phase = kBuilding;
    try {
      remove_litter(p.dir, log);
      build(p, cfg, blend, special, vocab_size, log);
      add_up();
      forget_made(p.dir);  // the folders are the cache's from the commit on
      commit(p, key, special, vocab_size);
      phase = kCommitted;
    } catch (...) {
      // a stop signal took the folder away underneath: the watcher reports it and exits
      // (exit 2); this thread must not report its own consequent failure
      if (stopping) for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      // a failure (a full disk, a refused tokenizer) leaves nothing of the build either; still
      // under the lock, so that no process waiting here starts on the folder meanwhile
      remove_stopped(p.dir, made_here);
      throw;
    }
  }
  lock.reset();  // (removes .lock) and then the guard: a signal in between finds nothing to clean
  interrupt.reset();
  summary();
  return p;
}

}  // namespace troupe
