// tests/test_datasets.cpp — the data layer: corpus, tokenizer, token files, loader, prepare.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "datasets/corpus.h"
#include "datasets/loader.h"
#include "datasets/prepare.h"
#include "datasets/token_file.h"
#include "datasets/tokenizer.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using troupe::UserError;

namespace {

const std::string kTinyCorpus = std::string(TROUPE_SOURCE_DIR) + "/tests/data/tiny_corpus.txt";

// A scratch folder for this test process, removed at exit.
struct ScratchDir {
  fs::path path;
  ScratchDir() {
    path = fs::temp_directory_path() / ("troupe_test_datasets_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

fs::path scratch(const std::string& name) {
  static ScratchDir dir;
  return dir.path / name;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out << bytes;
  REQUIRE(out.good());
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The test tokenizer: vocab 512, trained once on the train split of the tiny corpus.
const troupe::Tokenizer& tiny_tokenizer() {
  static const troupe::Tokenizer tok = [] {
    auto split = troupe::split_documents(troupe::read_corpus(kTinyCorpus), 0.05);
    const auto prefix = scratch("tok512/tokenizer").string();
    troupe::Tokenizer::train(split.train, 512, prefix);
    return troupe::Tokenizer::load(prefix + ".model");
  }();
  return tok;
}

}  // namespace

// ---------------------------------------------------------------- corpus

TEST_CASE("corpus: documents are separated by blank lines", "[datasets]") {
  const std::string text =
      "\xEF\xBB\xBF"  // byte-order mark, skipped
      "\n\nfirst line\nsecond  line\n\n\n"
      "crlf doc \r\nline two\r\n \t \r\n"
      "  indented last";
  const auto docs = troupe::parse_corpus(text, "inline");
  REQUIRE(docs.size() == 3);
  CHECK(docs[0] == "first line\nsecond  line");
  CHECK(docs[1] == "crlf doc \nline two");
  CHECK(docs[2] == "  indented last");

  const auto tiny = troupe::read_corpus(kTinyCorpus);
  CHECK(tiny.size() == 11);
  CHECK(tiny.front().rfind("Fellow-Citizens of the Senate", 0) == 0);
}

TEST_CASE("corpus: missing, empty and non-UTF-8 files are user errors", "[datasets]") {
  CHECK_THROWS_MATCHES(troupe::read_corpus(scratch("nope.txt").string()), UserError,
                       Catch::Matchers::Predicate<UserError>([](const UserError& e) {
                         const std::string m = e.what();
                         return m.find("does not exist") != std::string::npos &&
                                m.find("make data") != std::string::npos &&
                                m.find("data.corpus") != std::string::npos;
                       }));
  write_bytes(scratch("empty.txt"), "");
  CHECK_THROWS_WITH(troupe::read_corpus(scratch("empty.txt").string()), Contains("is empty"));
  write_bytes(scratch("blank.txt"), "\n \n\t\n\n");
  CHECK_THROWS_WITH(troupe::read_corpus(scratch("blank.txt").string()), Contains("no document"));
  CHECK_THROWS_AS(troupe::read_corpus(scratch("blank.txt").string()), UserError);

  write_bytes(scratch("latin1.txt"), "caf\xC3\xA9 ok\n\nna\xEFve\n");  // 0xEF 'v' is invalid
  CHECK_THROWS_WITH(troupe::read_corpus(scratch("latin1.txt").string()),
                    Contains("not valid UTF-8") && Contains("byte offset 12"));
  CHECK_THROWS_AS(troupe::read_corpus(scratch("latin1.txt").string()), UserError);

  using troupe::find_invalid_utf8;
  constexpr auto npos = std::string_view::npos;
  CHECK(find_invalid_utf8("plain ascii, 8+ bytes long") == npos);
  CHECK(find_invalid_utf8("\xF0\x9F\x98\x80 \xE6\xBC\xA2\xE5\xAD\x97 \xC3\xA9") == npos);
  CHECK(find_invalid_utf8("ab\xC0\xAF") == 2);          // overlong '/'
  CHECK(find_invalid_utf8("abc\xED\xA0\x80") == 3);     // surrogate U+D800
  CHECK(find_invalid_utf8("\xF4\x90\x80\x80") == 0);    // > U+10FFFF
  CHECK(find_invalid_utf8("0123456789\xE6\xBC") == 10);  // truncated at the end
  CHECK(find_invalid_utf8("x\x80") == 1);               // stray continuation byte
}

TEST_CASE("corpus: split keeps order, val is the last documents", "[datasets]") {
  std::vector<std::string> docs;
  for (int i = 0; i < 20; ++i) docs.push_back("doc " + std::to_string(i));
  auto s = troupe::split_documents(docs, 0.05);
  REQUIRE(s.train.size() == 19);
  REQUIRE(s.val.size() == 1);
  CHECK(s.train.front() == "doc 0");
  CHECK(s.val.front() == "doc 19");
  CHECK(troupe::split_documents(docs, 0.5).val.size() == 10);
  CHECK(troupe::split_documents(docs, 0.01).val.size() == 1);   // at least one val doc
  CHECK(troupe::split_documents(docs, 0.99).train.size() == 1);  // at least one train doc
  CHECK_THROWS_WITH(troupe::split_documents({"only one"}, 0.1), Contains("at least 2"));
  CHECK_THROWS_WITH(troupe::split_documents(docs, 0.0), Contains("data.val_fraction"));
  CHECK_THROWS_AS(troupe::split_documents(docs, 1.0), UserError);
}

TEST_CASE("corpus: FNV-1a 64 hash", "[datasets]") {
  CHECK(troupe::fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(troupe::fnv1a64("a") == 0xaf63dc4c8601ec8cull);  // published test vector
  CHECK(troupe::fnv1a64("foobar") == 0x85944171f73967e8ull);
  CHECK(troupe::fnv1a64("bar", troupe::fnv1a64("foo")) == troupe::fnv1a64("foobar"));
  CHECK(troupe::hash_hex(0xaf63dc4c8601ec8cull) == "af63dc4c8601ec8c");
  CHECK(troupe::hash_hex(0x1f) == "000000000000001f");
  CHECK(troupe::hash_file(kTinyCorpus) == troupe::fnv1a64(read_bytes(kTinyCorpus)));
}

// ---------------------------------------------------------------- tokenizer

TEST_CASE("tokenizer: layout of the trained vocabulary", "[datasets]") {
  const auto& tok = tiny_tokenizer();
  CHECK(tok.vocab_size() == 512);
  CHECK(tok.eot_id() == 1);
  CHECK(tok.piece(0) == "<unk>");
  CHECK(tok.piece(1) == "<|endoftext|>");
  CHECK(tok.piece(2) == "<0x00>");
  CHECK(tok.piece(257) == "<0xFF>");
  CHECK(tok.hash() == troupe::hash_file(tok.path()));
  // Common English merges were learned: " the" is one token.
  CHECK(tok.encode(" the").size() == 1);
}

TEST_CASE("tokenizer: decode(encode(s)) == s byte for byte", "[datasets]") {
  const auto& tok = tiny_tokenizer();
  const std::vector<std::string> cases = {
      "",
      " ",
      "   ",
      "Fellow-Citizens of the Senate and House of Representatives:",
      "  two leading spaces",
      "trailing spaces   ",
      "multiple    inner     spaces",
      "line one\nline two\n\n\nafter blank lines\n",
      "\n",
      "\r\nwindows\r\nline ends\r\n",
      "\ttabs\t\tand\t spaces \t",
      "emoji \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 and flags \xF0\x9F\x87\xBA\xF0\x9F\x87\xB8",
      "CJK \xE6\xBC\xA2\xE5\xAD\x97 \xE3\x81\x8B\xE3\x81\xAA and \xED\x95\x9C\xEA\xB8\x80",
      "caf\xC3\xA9 na\xC3\xAFve \xE2\x80\x94 \xE2\x80\x9Cquotes\xE2\x80\x9D",
      "\xE2\x96\x81 literal lower-one-eighth blocks \xE2\x96\x81\xE2\x96\x81x",  // U+2581
      "<|endoftext|> is plain text here",
      "<unk> <0x41> </s> <s>",
      std::string("nul\0byte", 8),
      "digits 1234567890 and $3,141.59",
      "\xF4\x8F\xBF\xBF max code point",
  };
  for (const auto& s : cases) {
    INFO("text: [" << s << "]");
    const auto ids = tok.encode(s);
    CHECK(tok.decode(ids) == s);
    for (int32_t id : ids) {
      REQUIRE(id >= 0);
      REQUIRE(id < tok.vocab_size());
      CHECK(id != 0);              // never <unk>: byte fallback covers everything
      CHECK(id != tok.eot_id());   // end-of-text only comes from tokenize_documents
    }
  }
  // The whole tiny corpus, document by document.
  for (const auto& d : troupe::read_corpus(kTinyCorpus)) REQUIRE(tok.decode(tok.encode(d)) == d);

  CHECK_THROWS_WITH(tok.encode("ok\xFF"), Contains("not valid UTF-8") && Contains("offset 2"));
  const std::vector<int32_t> eot = {tok.eot_id()};
  CHECK(tok.decode(eot) == "<|endoftext|>");
  const std::vector<int32_t> bad = {512};
  CHECK_THROWS_AS(tok.decode(bad), troupe::Error);
}

TEST_CASE("tokenizer: long lines are trained on and round-trip", "[datasets]") {
  // One document made of a single ~40 KB line: SentencePiece would silently skip it
  // (longer than the max_sentence_length we give it) if it were fed whole; the word
  // "qzvkx" appears only there.
  std::string long_line;
  for (int i = 0; i < 8000; ++i) long_line += (i % 2 ? " qzvkx" : " and");
  REQUIRE(long_line.size() > 4 * troupe::Tokenizer::kMaxTrainSentenceBytes);
  auto docs = troupe::split_documents(troupe::read_corpus(kTinyCorpus), 0.05).train;
  docs.push_back(long_line);
  const auto prefix = scratch("tok_long/tokenizer").string();
  troupe::Tokenizer::train(docs, 400, prefix);
  const auto tok = troupe::Tokenizer::load(prefix + ".model");
  CHECK(tok.encode(" qzvkx").size() == 1);  // learned from the long line
  CHECK(tok.decode(tok.encode(long_line)) == long_line);

  // A 20 KB line without any space (cut at character boundaries) round-trips too.
  std::string no_space;
  while (no_space.size() < 20000) no_space += "\xC3\xA9\xE6\xBC\xA2x";
  CHECK(tiny_tokenizer().decode(tiny_tokenizer().encode(no_space)) == no_space);
}

TEST_CASE("tokenizer: vocabulary size limits and bad model files", "[datasets]") {
  const auto docs = troupe::split_documents(troupe::read_corpus(kTinyCorpus), 0.05).train;
  std::string msg;
  try {
    troupe::Tokenizer::train(docs, 300, scratch("tok_small/a").string());
  } catch (const UserError& e) {
    msg = e.what();
  }
  REQUIRE_THAT(msg, Contains("model.vocab_size = 300 is too small") && Contains("at least"));
  const int minimum = std::stoi(msg.substr(msg.find("at least ") + 9));
  CHECK(minimum > 258);
  CHECK(minimum < 400);
  // The stated minimum is the real one: it trains, one less does not.
  CHECK_NOTHROW(troupe::Tokenizer::train(docs, minimum, scratch("tok_small/b").string()));
  CHECK(troupe::Tokenizer::load(scratch("tok_small/b.model").string()).vocab_size() == minimum);
  CHECK_THROWS_AS(troupe::Tokenizer::train(docs, minimum - 1, scratch("tok_small/c").string()),
                  UserError);

  CHECK_THROWS_AS(troupe::Tokenizer::load(scratch("missing.model").string()), UserError);
  write_bytes(scratch("not_a.model"), "this is not a protobuf");
  CHECK_THROWS_WITH(troupe::Tokenizer::load(scratch("not_a.model").string()),
                    Contains("not a SentencePiece model"));
}

TEST_CASE("tokenizer: tokenize_documents is deterministic across thread counts", "[datasets]") {
  const auto& tok = tiny_tokenizer();
  const auto docs = troupe::read_corpus(kTinyCorpus);
  const auto one = troupe::tokenize_documents(tok, docs, 1);
  const auto three = troupe::tokenize_documents(tok, docs, 3);
  CHECK(one == three);
  // Each document is followed by end-of-text.
  CHECK(std::count(one.begin(), one.end(), tok.eot_id()) == static_cast<long>(docs.size()));
  CHECK(one.back() == tok.eot_id());
  std::string joined;
  for (const auto& d : docs) joined += d + "<|endoftext|>";
  CHECK(tok.decode(one) == joined);
}

// ---------------------------------------------------------------- token files

TEST_CASE("token file: write and read back, u16 and u32", "[datasets]") {
  const std::vector<int32_t> small = {0, 1, 2, 511, 300, 7};
  const auto p16 = scratch("tf/small.bin").string();
  troupe::write_token_file(p16, small, 512, 0x1234abcdull);
  CHECK(fs::file_size(p16) == 64 + 2 * small.size());
  {
    const troupe::TokenFile f(p16);
    CHECK(f.size() == small.size());
    CHECK(f.dtype() == troupe::TokenDType::u16);
    CHECK(f.vocab_size() == 512);
    CHECK(f.tokenizer_hash() == 0x1234abcdull);
    CHECK(f.to_vector() == small);
    CHECK(f[3] == 511);
    int32_t buf[2];
    f.read(3, 2, buf);
    CHECK(buf[0] == 511);
    CHECK(buf[1] == 300);
    CHECK_THROWS_AS(f.read(5, 2, buf), troupe::Error);
    CHECK_NOTHROW(f.validate(512));
    CHECK_NOTHROW(f.check_tokenizer(0x1234abcdull));
    CHECK_THROWS_WITH(f.check_tokenizer(0x99), Contains("written with tokenizer 000000001234abcd") &&
                                                   Contains("re-tokenize"));
    const auto c = f.counts(512);
    CHECK(c[511] == 1);
    CHECK(c[0] == 1);
  }
  const std::vector<int32_t> big = {0, 65535, 65536, 69999};
  const auto p32 = scratch("tf/big.bin").string();
  troupe::write_token_file(p32, big, 70000, 42);
  CHECK(fs::file_size(p32) == 64 + 4 * big.size());
  const troupe::TokenFile f32(p32);
  CHECK(f32.dtype() == troupe::TokenDType::u32);
  CHECK(f32.to_vector() == big);
  // Ids outside the vocabulary in use: named with index, id and the fix.
  CHECK_THROWS_WITH(f32.validate(65536), Contains("token id 65536 at index 2") &&
                                             Contains("outside the vocabulary of 65536") &&
                                             Contains("delete"));
  CHECK_THROWS_AS(f32.validate(65536), UserError);
  // Writing ids outside the vocabulary is a bug upstream, and leaves no file behind.
  const std::vector<int32_t> oob = {3, 512};
  CHECK_THROWS_AS(troupe::write_token_file(scratch("tf/oob.bin").string(), oob, 512, 0), troupe::Error);
  CHECK_FALSE(fs::exists(scratch("tf/oob.bin")));
  for (const auto& e : fs::directory_iterator(scratch("tf")))  // no temporary files left
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
}

TEST_CASE("token file: truncated and corrupt files are user errors", "[datasets]") {
  const std::vector<int32_t> toks(100, 5);
  const auto good = scratch("tf_bad/good.bin");
  troupe::write_token_file(good.string(), toks, 512, 1);
  const std::string bytes = read_bytes(good);

  write_bytes(scratch("tf_bad/trunc.bin"), bytes.substr(0, bytes.size() - 1));
  CHECK_THROWS_WITH(troupe::TokenFile(scratch("tf_bad/trunc.bin").string()),
                    Contains("trunc.bin") && Contains("truncated or corrupt") &&
                        Contains("header says 100 tokens"));
  CHECK_THROWS_AS(troupe::TokenFile(scratch("tf_bad/trunc.bin").string()), UserError);

  write_bytes(scratch("tf_bad/short.bin"), bytes.substr(0, 30));
  CHECK_THROWS_WITH(troupe::TokenFile(scratch("tf_bad/short.bin").string()),
                    Contains("shorter than its 64-byte header"));

  write_bytes(scratch("tf_bad/long.bin"), bytes + "xx");
  CHECK_THROWS_AS(troupe::TokenFile(scratch("tf_bad/long.bin").string()), UserError);

  std::string magic = bytes;
  magic[0] = 'X';
  write_bytes(scratch("tf_bad/magic.bin"), magic);
  CHECK_THROWS_WITH(troupe::TokenFile(scratch("tf_bad/magic.bin").string()),
                    Contains("magic.bin") && Contains("bad magic"));

  std::string version = bytes;
  version[8] = 2;
  write_bytes(scratch("tf_bad/version.bin"), version);
  CHECK_THROWS_WITH(troupe::TokenFile(scratch("tf_bad/version.bin").string()),
                    Contains("format version 2"));

  CHECK_THROWS_AS(troupe::TokenFile(scratch("tf_bad/missing.bin").string()), UserError);
}

// ---------------------------------------------------------------- loader

namespace {
// train.bin = 0, 1, ..., n-1 (so a window's content tells where it started); val likewise.
troupe::BatchLoader arange_loader(const std::string& name, int n_train, int n_val) {
  std::vector<int32_t> train(static_cast<size_t>(n_train)), val(static_cast<size_t>(n_val));
  for (int i = 0; i < n_train; ++i) train[static_cast<size_t>(i)] = i;
  for (int i = 0; i < n_val; ++i) val[static_cast<size_t>(i)] = 50000 + i;
  const auto tp = scratch("loader/" + name + "_train.bin").string();
  const auto vp = scratch("loader/" + name + "_val.bin").string();
  troupe::write_token_file(tp, train, 60000, 7);
  troupe::write_token_file(vp, val, 60000, 7);
  return troupe::BatchLoader(tp, vp);
}
}  // namespace

TEST_CASE("loader: train batches are deterministic and keyed by (seed, step, sample)", "[datasets]") {
  const int B = 8, T = 16, n = 5000;
  const auto loader = arange_loader("det", n, 200);
  auto batch = [&](uint64_t seed, int64_t step) {
    std::vector<int32_t> x(B * T), y(B * T);
    loader.get_train_batch(seed, step, B, T, x.data(), y.data());
    return std::make_pair(x, y);
  };
  const auto a = batch(1337, 5);
  CHECK(batch(1337, 5) == a);
  std::pair<std::vector<int32_t>, std::vector<int32_t>> from_thread;
  std::thread([&] { from_thread = batch(1337, 5); }).join();
  CHECK(from_thread == a);
  CHECK(batch(1337, 6).first != a.first);
  CHECK(batch(1338, 5).first != a.first);

  for (int i = 0; i < B; ++i) {
    const int32_t start = a.first[static_cast<size_t>(i * T)];
    CHECK(start == static_cast<int32_t>(troupe::batch_sample_start(1337, 5, i, n, T)));
    CHECK(start >= 0);
    CHECK(start <= n - T - 1);
    for (int j = 0; j < T; ++j) {
      CHECK(a.first[static_cast<size_t>(i * T + j)] == start + j);
      CHECK(a.second[static_cast<size_t>(i * T + j)] == start + j + 1);  // shifted by one
    }
  }
  // A slice of the batch (microbatch / DP shard) equals the matching rows.
  std::vector<int32_t> x(3 * T), y(3 * T);
  loader.get_train_samples(1337, 5, 2, 3, T, x.data(), y.data());
  CHECK(std::equal(x.begin(), x.end(), a.first.begin() + 2 * T));
  CHECK(std::equal(y.begin(), y.end(), a.second.begin() + 2 * T));
}

TEST_CASE("loader: start positions cover [0, n - T - 1] uniformly", "[datasets]") {
  const uint64_t n = 26;
  const int T = 16;  // 10 possible starts
  std::vector<int> hits(10, 0);
  for (int64_t step = 0; step < 2000; ++step) {
    const uint64_t s = troupe::batch_sample_start(42, step, 0, n, T);
    REQUIRE(s < 10);
    ++hits[s];
  }
  for (int h : hits) {  // expected 200 each
    CHECK(h > 140);
    CHECK(h < 260);
  }
}

TEST_CASE("loader: validation windows are consecutive and wrap around", "[datasets]") {
  const int T = 10;
  const auto loader = arange_loader("val", 1000, 35);  // (35 - 1) / 10 = 3 windows
  CHECK(loader.val_windows(T) == 3);
  std::vector<int32_t> x(2 * T), y(2 * T);
  loader.get_val_batch(0, 2, T, x.data(), y.data());
  CHECK(x[0] == 50000);
  CHECK(x[T] == 50010);
  CHECK(y[T - 1] == 50010);
  loader.get_val_batch(1, 2, T, x.data(), y.data());  // windows 2 and 3 -> 2 and 0
  CHECK(x[0] == 50020);
  CHECK(y[T - 1] == 50030);
  CHECK(x[T] == 50000);

  const auto short_val = arange_loader("short", 1000, 10);
  CHECK_THROWS_WITH(short_val.get_val_batch(0, 1, T, x.data(), y.data()),
                    Contains("fewer than train.seq_len + 1 = 11") && Contains("data.val_fraction"));
  const auto short_train = arange_loader("short_train", 10, 100);
  CHECK_THROWS_WITH(short_train.get_train_batch(1, 0, 1, T, x.data(), y.data()),
                    Contains("train split") && Contains("train.seq_len"));
  CHECK_THROWS_AS(short_train.get_train_batch(1, 0, 1, T, x.data(), y.data()), UserError);
}

// ---------------------------------------------------------------- entropy + prepare

TEST_CASE("unigram cross-entropy matches a hand computation", "[datasets]") {
  // V = 3, train = {0, 0, 1}: p = (c + 1) / (3 + 3) = {3/6, 2/6, 1/6}.
  // val = {0, 2}: H = -(ln(1/2) + ln(1/6)) / 2 = ln(12) / 2.
  const std::vector<int32_t> train = {0, 0, 1}, val = {0, 2};
  CHECK(troupe::unigram_cross_entropy(train, val, 3) == Approx(std::log(12.0) / 2).epsilon(1e-14));
  const std::vector<uint64_t> tc = {2, 1, 0}, vc = {1, 0, 1};
  CHECK(troupe::unigram_cross_entropy(tc, vc) == Approx(1.2424533248940002).epsilon(1e-14));
  // A uniform model (no train tokens) gives ln V.
  const std::vector<int32_t> none;
  CHECK(troupe::unigram_cross_entropy(none, val, 8) == Approx(std::log(8.0)).epsilon(1e-14));
}

TEST_CASE("prepare: tokenizer + token files, cached and reused", "[datasets]") {
  troupe::DataConfig cfg;
  cfg.corpus = kTinyCorpus;
  cfg.cache_dir = scratch("cache").string();
  cfg.val_fraction = 0.1;
  std::vector<std::string> log;
  const auto p = troupe::prepare_data(cfg, 512, [&](const std::string& s) { log.push_back(s); });
  CHECK_FALSE(p.from_cache);
  CHECK(p.dir == cfg.cache_dir + "/" + p.key + "-v512");
  REQUIRE(p.sources.size() == 1);
  const auto& src = p.sources[0];
  CHECK(p.train_docs == 10);
  CHECK(p.val_docs == 1);
  CHECK(p.eot_id == 1);
  CHECK(fs::exists(p.dir + "/meta.json"));

  const auto docs = troupe::read_corpus(kTinyCorpus);
  const auto tok = troupe::Tokenizer::load(p.tokenizer_path);
  CHECK(tok.hash() == p.tokenizer_hash);
  const troupe::TokenFile train(src.train_path), val(src.val_path);
  CHECK(train.size() == p.train_tokens);
  CHECK(val.size() == p.val_tokens);
  CHECK(train.tokenizer_hash() == p.tokenizer_hash);
  // The token files decode to the documents, each followed by end-of-text.
  std::string want_train, want_val;
  for (size_t i = 0; i < docs.size(); ++i) (i < 10 ? want_train : want_val) += docs[i] + "<|endoftext|>";
  CHECK(tok.decode(train.to_vector()) == want_train);
  CHECK(tok.decode(val.to_vector()) == want_val);
  const double h = troupe::unigram_cross_entropy(train.to_vector(), val.to_vector(), 512);
  CHECK(p.unigram_entropy == h);
  CHECK(h > 3.0);
  CHECK(h < std::log(512.0));
  CHECK(std::any_of(log.begin(), log.end(), [](const std::string& s) {
    return s.find("tokenizing corpus: done") != std::string::npos;
  }));

  // Second run: reused, same numbers.
  const auto again = troupe::prepare_data(cfg, 512);
  CHECK(again.from_cache);
  CHECK(again.train_tokens == p.train_tokens);
  CHECK(again.tokenizer_hash == p.tokenizer_hash);
  CHECK(again.unigram_entropy == p.unigram_entropy);

  // A truncated token file in a committed cache is refused, naming the file (nothing is
  // silently rewritten); deleting the folder rebuilds identical content. (Copy the tokens
  // first: `train` maps the very inode that resize_file shortens.)
  const std::vector<int32_t> train_tokens = train.to_vector();
  fs::resize_file(src.train_path, fs::file_size(src.train_path) - 2);
  try {
    troupe::prepare_data(cfg, 512);
    FAIL("a damaged cache was accepted");
  } catch (const troupe::UserError& e) {
    CHECK(std::string(e.what()).find("train.bin") != std::string::npos);
    CHECK(std::string(e.what()).find("delete") != std::string::npos);
  }
  fs::remove_all(p.dir);
  const auto rebuilt = troupe::prepare_data(cfg, 512);
  CHECK_FALSE(rebuilt.from_cache);
  CHECK(rebuilt.tokenizer_hash == p.tokenizer_hash);  // training is deterministic
  CHECK(troupe::TokenFile(src.train_path).to_vector() == train_tokens);

  // Another val_fraction is another split: rebuilt.
  cfg.val_fraction = 0.3;
  const auto resplit = troupe::prepare_data(cfg, 512);
  CHECK_FALSE(resplit.from_cache);
  CHECK(resplit.val_docs == 3);
}

TEST_CASE("prepare: data.tokenizer is used as given and its size must match", "[datasets]") {
  troupe::DataConfig cfg;
  cfg.corpus = kTinyCorpus;
  cfg.cache_dir = scratch("cache_user").string();
  cfg.tokenizer = tiny_tokenizer().path();
  CHECK_THROWS_WITH(troupe::prepare_data(cfg, 1024),
                    Contains("has 512 pieces but model.vocab_size = 1024") &&
                        Contains("set model.vocab_size = 512"));
  CHECK_THROWS_AS(troupe::prepare_data(cfg, 1024), UserError);
  const auto p = troupe::prepare_data(cfg, 512);
  CHECK(p.tokenizer_hash == tiny_tokenizer().hash());
  CHECK(troupe::TokenFile(p.sources[0].train_path).tokenizer_hash() == tiny_tokenizer().hash());

  cfg.tokenizer.clear();
  cfg.corpus = scratch("no_such_corpus.txt").string();
  CHECK_THROWS_WITH(troupe::prepare_data(cfg, 512), Contains("make data"));
}
