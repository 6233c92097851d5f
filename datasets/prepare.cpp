// datasets/prepare.cpp — see prepare.h.
#include "datasets/prepare.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "datasets/token_file.h"
#include "datasets/tokenizer.h"

namespace troupe {

namespace fs = std::filesystem;

namespace {

// Bump when the meaning of the cached files changes (how documents are joined, ...).
constexpr int kCacheFormat = 1;

std::string fmt_mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

// Holds an exclusive flock on <dir>/.lock for its lifetime, and removes the file as it lets
// go (no litter). A waiter that then holds a lock on the removed file opens the new one.
class DirLock {
 public:
  DirLock(const std::string& dir, const DataLogFn& log) : path_(dir + "/.lock") {
    for (bool said = false;;) {
      fd_ = ::open(path_.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
      TROUPE_USER_CHECK(fd_ >= 0) << "cannot create '" << path_ << "': " << std::strerror(errno)
                                  << "; check permissions or set data.cache_dir";
      if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        if (log && !said) log("waiting for another process preparing " + dir);
        said = true;
        while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
        }
      }
      struct stat held {}, now {};
      if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
          held.st_dev == now.st_dev)
        return;
      ::close(fd_);  // the holder before removed it: lock the file that is there now
    }
  }
  ~DirLock() {
    ::unlink(path_.c_str());
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// What meta.json records; `problem` explains why a cache cannot be reused ("" = reusable).
struct CacheKey {
  std::string corpus_hash;
  int vocab_size;
  double val_fraction;
  std::string tokenizer_source;  // "trained" or "file"
  std::string user_tokenizer_hash;  // hash of data.tokenizer when source == "file"
};

std::string reuse_problem(const PreparedData& p, const CacheKey& key, nlohmann::json* meta_out) {
  const std::string meta_path = p.dir + "/meta.json";
  if (!fs::exists(meta_path)) return "no cache yet";
  nlohmann::json meta;
  try {
    std::ifstream in(meta_path);
    meta = nlohmann::json::parse(in);
    if (meta.value("format", 0) != kCacheFormat) return "cache format changed";
    if (meta.at("corpus_hash").get<std::string>() != key.corpus_hash) return "corpus changed";
    if (meta.at("vocab_size").get<int>() != key.vocab_size) return "vocab size changed";
    if (meta.at("val_fraction").get<double>() != key.val_fraction) return "data.val_fraction changed";
    if (meta.at("tokenizer_source").get<std::string>() != key.tokenizer_source) return "data.tokenizer changed";
    if (key.tokenizer_source == "file" &&
        meta.at("tokenizer_hash").get<std::string>() != key.user_tokenizer_hash)
      return "data.tokenizer changed";
  } catch (const std::exception& e) {
    return std::string("meta.json unreadable (") + e.what() + ")";
  }
  for (const auto* f : {&p.tokenizer_path, &p.train_path, &p.val_path})
    if (!fs::exists(*f)) return fs::path(*f).filename().string() + " missing";
  *meta_out = std::move(meta);
  return "";
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
  for (unsigned t = 1; t < nt; ++t) pool.emplace_back(work);
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

PreparedData prepare_data(const DataConfig& cfg, int vocab_size, const DataLogFn& log) {
  auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  TROUPE_USER_CHECK(vocab_size >= Tokenizer::kMinVocabSize)
      << "model.vocab_size = " << vocab_size << " is too small: the tokenizer needs at least "
      << Tokenizer::kMinVocabSize << " (2 special + 256 byte pieces + the corpus's characters)";

  PreparedData p;
  uint64_t corpus_hash = 0;
  std::vector<std::string> docs = read_corpus(cfg.corpus, &corpus_hash);
  for (const auto& d : docs) p.corpus_bytes += d.size();
  p.corpus_hash = hash_hex(corpus_hash);
  CorpusSplit split = split_documents(std::move(docs), cfg.val_fraction);
  p.train_docs = split.train.size();
  p.val_docs = split.val.size();
  p.vocab_size = vocab_size;

  CacheKey key{p.corpus_hash, vocab_size, cfg.val_fraction, "trained", ""};
  if (!cfg.tokenizer.empty()) {
    const Tokenizer user = Tokenizer::load(cfg.tokenizer);
    TROUPE_USER_CHECK(user.vocab_size() == vocab_size)
        << "data.tokenizer '" << cfg.tokenizer << "' has " << user.vocab_size()
        << " pieces but model.vocab_size = " << vocab_size << "; set model.vocab_size = "
        << user.vocab_size() << ", or leave data.tokenizer empty to train a tokenizer of "
        << vocab_size << " pieces";
    key.tokenizer_source = "file";
    key.user_tokenizer_hash = hash_hex(user.hash());
  }

  p.dir = (fs::path(cfg.cache_dir) / (p.corpus_hash + "-v" + std::to_string(vocab_size))).string();
  p.tokenizer_path = p.dir + "/tokenizer.model";
  p.train_path = p.dir + "/train.bin";
  p.val_path = p.dir + "/val.bin";
  // A preparation that fails (a full disk, a refused tokenizer) removes the folders it
  // created itself: a refused command leaves no empty cache/<hash>-v<V>/ behind.
  struct RemoveCreatedOnError {
    fs::path first_new;  // the outermost folder this call created; empty: none
    int exceptions = std::uncaught_exceptions();
    ~RemoveCreatedOnError() {
      std::error_code ec;
      if (!first_new.empty() && std::uncaught_exceptions() > exceptions) fs::remove_all(first_new, ec);
    }
  } cleanup;
  {
    std::error_code ec;
    fs::path q = fs::absolute(p.dir, ec);
    for (; !q.empty() && !fs::exists(q, ec) && q != q.parent_path(); q = q.parent_path()) cleanup.first_new = q;
    fs::create_directories(p.dir, ec);
    TROUPE_USER_CHECK(!ec && fs::is_directory(p.dir))
        << "cannot create the data cache folder '" << p.dir << "': " << ec.message()
        << "; check permissions or set data.cache_dir";
  }
  DirLock lock(p.dir, log);

  nlohmann::json meta;
  std::string problem = reuse_problem(p, key, &meta);
  if (problem.empty()) {
    try {  // the cheap checks passed: now the files themselves
      const Tokenizer tok = Tokenizer::load(p.tokenizer_path);
      const TokenFile train(p.train_path), val(p.val_path);
      if (hash_hex(tok.hash()) != meta.at("tokenizer_hash").get<std::string>() ||
          tok.vocab_size() != vocab_size)
        problem = "tokenizer.model changed";
      else if (train.size() != meta.at("train_tokens").get<uint64_t>() ||
               val.size() != meta.at("val_tokens").get<uint64_t>())
        problem = "token counts differ from meta.json";
      else if (train.tokenizer_hash() != tok.hash() || val.tokenizer_hash() != tok.hash())
        problem = "token files were written by another tokenizer";
      if (problem.empty()) {
        train.validate(vocab_size);
        val.validate(vocab_size);
      }
    } catch (const std::exception& e) {
      problem = e.what();
    }
    // A committed cache whose files do not match its meta.json was damaged after it was
    // written: refuse (naming the file) rather than silently rewrite what is there.
    if (!problem.empty())
      throw UserError("the data cache " + p.dir + " is damaged: " + problem +
                      (problem.find("delete") == std::string::npos ? "; delete that folder to rebuild it" : ""));
  }

  if (problem.empty()) {
    say("data: reusing " + p.dir);
    p.from_cache = true;
  } else {
    say("data: preparing " + p.dir + " (" + problem + ")");
    std::error_code ec;
    fs::remove(p.dir + "/meta.json", ec);  // uncommit first: a crash below leaves no valid cache
    // what an interrupted preparation left (this process holds the folder's lock)
    std::vector<fs::path> old;
    for (fs::directory_iterator it(p.dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().filename() != ".lock") old.push_back(it->path());
    std::string left;
    for (const auto& f : old)
      if (std::error_code rm; fs::remove_all(f, rm) > 0 && !rm) left += (left.empty() ? "" : ", ") + f.filename().string();
    if (!left.empty()) say("data: removed " + left + " (left by an interrupted or outdated preparation) in " + p.dir);
    if (cfg.tokenizer.empty()) {
      Tokenizer::train(split.train, vocab_size, p.dir + "/tokenizer", log);
    } else {
      write_file_atomic(p.tokenizer_path, read_file_bytes(cfg.tokenizer, "tokenizer model"));
    }
    const Tokenizer tok = Tokenizer::load(p.tokenizer_path);
    TROUPE_CHECK(tok.vocab_size() == vocab_size) << "tokenizer has " << tok.vocab_size() << " pieces";
    for (int s = 0; s < 2; ++s) {
      const auto& docs_s = s == 0 ? split.train : split.val;
      const std::string name = s == 0 ? "train" : "val";
      const std::vector<int32_t> tokens = tokenize_documents(tok, docs_s, 0, log, name);
      write_token_file(s == 0 ? p.train_path : p.val_path, tokens, vocab_size, tok.hash());
    }
    const TokenFile train(p.train_path), val(p.val_path);
    meta = nlohmann::json{
        {"format", kCacheFormat},
        {"corpus", cfg.corpus},
        {"corpus_hash", p.corpus_hash},
        {"corpus_bytes", p.corpus_bytes},
        {"val_fraction", cfg.val_fraction},
        {"vocab_size", vocab_size},
        {"tokenizer_source", key.tokenizer_source},
        {"tokenizer_file", cfg.tokenizer},
        {"tokenizer_hash", hash_hex(tok.hash())},
        {"eot_id", tok.eot_id()},
        {"train_docs", p.train_docs},
        {"val_docs", p.val_docs},
        {"train_tokens", train.size()},
        {"val_tokens", val.size()},
    };
  }

  const Tokenizer tok = Tokenizer::load(p.tokenizer_path);
  const TokenFile train(p.train_path), val(p.val_path);
  p.tokenizer_hash = tok.hash();
  p.eot_id = tok.eot_id();
  p.train_tokens = train.size();
  p.val_tokens = val.size();
  p.unigram_entropy = unigram_cross_entropy(train.counts(vocab_size), val.counts(vocab_size));
  if (!p.from_cache) {
    meta["unigram_entropy"] = p.unigram_entropy;
    write_file_atomic(p.dir + "/meta.json", meta.dump(2) + "\n");
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "data: %zu train docs -> %llu tokens, %zu val docs -> %llu tokens, vocab %d, "
                "unigram entropy %.4f nats/token",
                p.train_docs, static_cast<unsigned long long>(p.train_tokens), p.val_docs,
                static_cast<unsigned long long>(p.val_tokens), vocab_size, p.unigram_entropy);
  say(line);
  return p;
}

}  // namespace troupe
