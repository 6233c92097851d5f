// tests/test_blend.cpp — data at scale: blend config, cleaning, near-dup detection (planted),
// streaming prepare with report and indexed token files, the weighted blend loader, and
// bad input through the `troupe prepare` command.
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <sentencepiece_processor.h>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <map>
#include <random>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "cli_helpers.h"
#include "core/config.h"
#include "core/error.h"
#include "datasets/clean.h"
#include "datasets/corpus.h"
#include "datasets/loader.h"
#include "datasets/minhash.h"
#include "datasets/prepare.h"
#include "datasets/token_file.h"
#include "datasets/tokenizer.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using troupe::test::Scratch;
using troupe::test::slurp;

namespace {

const std::string kTiny = std::string(TROUPE_SOURCE_DIR) + "/tests/data/tiny_corpus.txt";

// A pseudo-word vocabulary of `n` distinct lowercase words (3..9 letters), fixed by the seed.
std::vector<std::string> word_list(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::set<std::string> seen;
  std::vector<std::string> out;
  while (out.size() < n) {
    std::string w(3 + rng() % 7, 'a');
    for (char& c : w) c = static_cast<char>('a' + rng() % 26);
    if (seen.insert(w).second) out.push_back(w);
  }
  return out;
}

// A "document" of `words` random words in lines of 12, with some stop words so that the
// quality filters keep it.
std::string random_doc(const std::vector<std::string>& vocab, size_t words, std::mt19937_64& rng) {
  static const char* kStop[] = {"the", "of", "and", "to", "with", "that"};
  std::string d;
  for (size_t i = 0; i < words; ++i) {
    const bool stop = rng() % 5 == 0;
    d += stop ? kStop[rng() % 6] : vocab[rng() % vocab.size()];
    d += (i + 1) % 12 == 0 && i + 1 < words ? "\n" : " ";
  }
  d.pop_back();
  return d;
}

// `doc` with ~5% of its words edited at random: substituted, deleted or a word inserted.
std::string edit_doc(const std::string& doc, const std::vector<std::string>& vocab, std::mt19937_64& rng) {
  std::vector<std::string> w;
  for (size_t i = 0; i < doc.size();) {
    size_t j = doc.find_first_of(" \n", i);
    if (j == std::string::npos) j = doc.size();
    w.push_back(doc.substr(i, j - i));
    i = j + 1;
  }
  const size_t edits = std::max<size_t>(1, w.size() / 20);
  for (size_t e = 0; e < edits; ++e) {
    const size_t at = rng() % w.size();
    switch (rng() % 3) {
      case 0: w[at] = vocab[rng() % vocab.size()]; break;
      case 1: if (w.size() > 2) w.erase(w.begin() + static_cast<ptrdiff_t>(at)); break;
      default: w.insert(w.begin() + static_cast<ptrdiff_t>(at), vocab[rng() % vocab.size()]);
    }
  }
  std::string out;
  for (size_t i = 0; i < w.size(); ++i) out += w[i] + ((i + 1) % 12 == 0 ? "\n" : " ");
  out.pop_back();
  return out;
}

troupe::DataSource source(const std::string& name, const std::string& path, const std::string& format = "text") {
  troupe::DataSource s;
  s.name = name;
  s.path = path;
  s.format = format;
  return s;
}

// Every document of a token file, decoded through its index (end-of-text dropped).
std::vector<std::string> decode_docs(const troupe::Tokenizer& tok, const std::string& bin, const std::string& idx) {
  const troupe::TokenFile f(bin);
  const troupe::DocIndex ix = troupe::read_doc_index(idx);
  REQUIRE(ix.tokens() == f.size());
  std::vector<std::string> out;
  for (uint64_t d = 0; d < ix.docs(); ++d) {
    std::vector<int32_t> ids(ix.offsets[d + 1] - ix.offsets[d]);
    f.read(ix.offsets[d], ids.size(), ids.data());
    REQUIRE(ids.back() == tok.eot_id());
    ids.pop_back();
    out.push_back(tok.decode(ids));
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- config

TEST_CASE("blend config: [[data.sources]] parse, round-trip and refusals", "[datasets][blend]") {
  const std::string text = R"(
[data]
cache_dir = "x"
[[data.sources]]
name = "speeches"
path = "data/sotu.txt"
weight = 2.0
[[data.sources]]
name = "mail"
path = "data/mail.jsonl"
format = "jsonl"
field = "body"
utf8 = "replace"
near_dedup = false
)";
  troupe::Config c = troupe::Config::parse(text, "blend.toml");
  REQUIRE(c.data.sources.size() == 2);
  CHECK(c.data.sources[0].weight == 2.0);
  CHECK(c.data.sources[1].field == "body");
  CHECK_FALSE(c.data.sources[1].near_dedup);
  CHECK(c.data.sources[1].near_threshold == 0.8);
  c.validate();
  const troupe::Config back = troupe::Config::parse(c.to_toml(), "saved");
  CHECK(back.key_values() == c.key_values());
  CHECK(back.data.sources[1].utf8 == "replace");
  // the old keys: a one-source blend
  troupe::Config legacy;
  REQUIRE(legacy.data.blend().size() == 1);
  CHECK(legacy.data.blend()[0].path == "data/sotu.txt");

  auto refuse = [&](const std::string& extra, const char* needle) {
    troupe::Config bad = troupe::Config::parse(text + extra, "blend.toml");
    CHECK_THROWS_WITH(bad.validate(), Contains(needle));
  };
  refuse("[[data.sources]]\nname = \"zero\"\npath = \"p\"\nweight = 0.0\n", "source 'zero' has weight = 0");
  refuse("[[data.sources]]\nname = \"neg\"\npath = \"p\"\nweight = -1.0\n", "must be a finite number > 0");
  refuse("[[data.sources]]\nname = \"mail\"\npath = \"p\"\n", "used twice");
  refuse("[[data.sources]]\nname = \"f\"\npath = \"p\"\nformat = \"csv\"\n", "format = \"csv\"");
  CHECK_THROWS_WITH(troupe::Config::parse(text + "[[data.sources]]\nname = \"q\"\nwieght = 1.0\n", "blend.toml"),
                    Contains("unknown key 'wieght' in data.sources[2]"));
}

// ---------------------------------------------------------------- cleaning

TEST_CASE("clean: UTF-8 repair, NFC, quality filters", "[datasets][blend]") {
  std::string s = "ok \xff\xfe end \xc3";
  std::string dropped = s, replaced = s, refused = s;
  CHECK(troupe::repair_utf8(dropped, troupe::Utf8Policy::drop) == 3);
  CHECK(dropped == "ok  end ");
  CHECK(troupe::repair_utf8(replaced, troupe::Utf8Policy::replace) == 3);
  CHECK(replaced == "ok \xEF\xBF\xBD end \xEF\xBF\xBD");
  CHECK(troupe::repair_utf8(refused, troupe::Utf8Policy::refuse) == 3);
  CHECK(refused == s);

  std::string decomposed = "caf" "e\xCC\x81";  // e + combining acute
  CHECK(troupe::normalize_nfc(decomposed));
  CHECK(decomposed == "caf\xC3\xA9");
  CHECK_FALSE(troupe::normalize_nfc(decomposed));  // already NFC

  std::mt19937_64 rng(7);
  const auto vocab = word_list(3000, 1);
  const std::string good = random_doc(vocab, 200, rng);
  CHECK(troupe::quality_check(good) == -1);
  auto name = [](int f) { return f < 0 ? std::string("kept") : std::string(troupe::kQualityFilters[f]); };
  CHECK(name(troupe::quality_check("the cat and the dog")) == "words");
  std::string lines;
  for (int i = 0; i < 20; ++i) lines += "the same line of text and more words that repeat\n";
  CHECK(name(troupe::quality_check(lines)) == "dup_lines");
  std::string hashes;
  for (int i = 0; i < 60; ++i) hashes += "#tag the of ";
  CHECK(name(troupe::quality_check(hashes)) == "symbols");
  std::string ellipses;
  for (int i = 0; i < 10; ++i) ellipses += random_doc(vocab, 8, rng) + " and so on...\n";
  CHECK(name(troupe::quality_check(ellipses)) == "ellipsis_lines");
  std::string numbers;
  for (int i = 0; i < 80; ++i) numbers += std::to_string(i * 7919) + " ";
  CHECK(name(troupe::quality_check(numbers + " the of")) == "alpha_words");
  CHECK(name(troupe::quality_check(random_doc(vocab, 200, rng) + " " + good.substr(0, good.size() / 2) + " " +
                                   good.substr(0, good.size() / 2))) == "dup_ngrams");
}

// ---------------------------------------------------------------- near duplicates

TEST_CASE("near-dup: MinHash + LSH finds >= 95% of planted 5% edits, removes <= 1% of distinct documents",
          "[datasets][blend]") {
  std::mt19937_64 rng(2026);
  const auto vocab = word_list(20000, 3);
  std::vector<std::string> originals;
  for (int i = 0; i < 1000; ++i) originals.push_back(random_doc(vocab, 150 + rng() % 400, rng));
  // the corpus: every original, then 300 planted near-duplicates of random originals
  std::vector<std::pair<std::string, bool>> corpus;  // (text, is planted)
  for (auto& d : originals) corpus.push_back({d, false});
  for (int i = 0; i < 300; ++i) corpus.push_back({edit_doc(originals[rng() % originals.size()], vocab, rng), true});
  troupe::LshIndex lsh;
  int planted_found = 0, distinct_removed = 0;
  for (auto& [text, planted] : corpus) {
    const bool dup = lsh.check_and_add(troupe::minhash_signature(text), 0.8);
    if (planted) planted_found += dup;
    else distinct_removed += dup;
  }
  INFO("found " << planted_found << " of 300 planted, removed " << distinct_removed << " of 1000 distinct");
  CHECK(planted_found >= 285);
  CHECK(distinct_removed <= 10);
  // the estimate tracks the real similarity: an unrelated pair is far below the threshold
  CHECK(troupe::minhash_similarity(troupe::minhash_signature(originals[0]), troupe::minhash_signature(originals[1])) < 0.2);
  CHECK(troupe::minhash_signature("Same Words here") == troupe::minhash_signature("here same   words"));
}

// ---------------------------------------------------------------- prepare

TEST_CASE("prepare: a blend of text, jsonl and dir sources, cleaned, reported, indexed, deterministic",
          "[datasets][blend]") {
  Scratch s("blend", "prepare");
  std::mt19937_64 rng(11);
  const auto vocab = word_list(4000, 5);
  // text: 30 documents, one exact duplicate, one near duplicate, one too short
  std::vector<std::string> text_docs;
  for (int i = 0; i < 30; ++i) text_docs.push_back(random_doc(vocab, 120, rng));
  std::string text;
  for (auto& d : text_docs) text += d + "\n\n";
  text += text_docs[3] + "\n\n" + edit_doc(text_docs[5], vocab, rng) + "\n\nshort one\n";
  s.write("a.txt", text);
  // jsonl: 12 documents in field "body", with multi-byte text, one NFC-decomposed
  std::string jsonl;
  for (int i = 0; i < 12; ++i) {
    std::string body = random_doc(vocab, 80, rng) + (i == 0 ? " caf" "e\xCC\x81 \xF0\x9F\x98\x80 \xE6\xBC\xA2\xE5\xAD\x97" : "");
    jsonl += nlohmann::json{{"body", body}, {"id", i}}.dump() + "\n";
  }
  s.write("b.jsonl", jsonl);
  fs::create_directories(s.path("code/pkg"));
  for (int i = 0; i < 6; ++i) s.write("code/pkg/m" + std::to_string(i) + ".py", "def f" + std::to_string(i) + "(x):\n\treturn x + " + std::to_string(i) + "\n");
  s.write("code/README", "not python\n");

  troupe::DataConfig cfg;
  cfg.cache_dir = s.path("cache");
  cfg.val_fraction = 0.2;
  cfg.sources = {source("a", s.path("a.txt")), source("b", s.path("b.jsonl"), "jsonl"), source("code", s.path("code"), "dir")};
  cfg.sources[1].field = "body";
  cfg.sources[1].weight = 0.5;
  cfg.sources[2].glob = "*.py";
  cfg.sources[2].quality = false;
  cfg.special_tokens = "<|user|>, <|bot|>";
  cfg.threads = 2;
  std::vector<std::string> log;
  const auto p = troupe::prepare_data(cfg, 600, [&](const std::string& l) { log.push_back(l); });
  REQUIRE(p.sources.size() == 3);
  const auto& a = p.sources[0].report;
  CHECK(a.docs_in == 33);
  CHECK(a.exact_duplicates == 1);
  CHECK(a.near_duplicates == 1);
  CHECK(a.filtered[0] == 1);  // "words": the short one
  CHECK(a.docs_kept == 30);
  CHECK(p.sources[0].val_docs == 6);
  CHECK(p.sources[0].train_docs == 24);
  CHECK(p.sources[1].report.normalized == 1);
  CHECK(p.sources[2].report.docs_in == 6);  // README is not *.py

  // the report: JSON with the documented shape, removed samples beside it
  const auto rep = nlohmann::json::parse(slurp(p.report_path));
  CHECK(rep["sources"][0]["name"] == "a");
  CHECK(rep["sources"][0]["exact_duplicates"] == 1);
  CHECK(rep["sources"][0]["filtered"]["words"] == 1);
  CHECK(rep["sources"][1]["docs_kept"] == 12);
  CHECK(rep["tokenizer"]["hash"] == troupe::hash_hex(p.tokenizer_hash));
  CHECK(rep["tokenizer"]["special_tokens"].size() == 2);
  const std::string removed = slurp(p.removed_path);
  CHECK(removed.find("\"reason\":\"exact_duplicate\"") != std::string::npos);
  CHECK(removed.find("\"reason\":\"near_duplicate\"") != std::string::npos);
  CHECK(removed.find("short one") != std::string::npos);

  // token files decode, document by document through the index, to the kept documents
  const auto tok = troupe::Tokenizer::load(p.tokenizer_path);
  CHECK(tok.piece(2) == "<|user|>");
  CHECK(tok.piece(3) == "<|bot|>");
  CHECK(tok.encode("<|bot|>") == std::vector<int32_t>{3});
  // byte-for-byte round trip with special tokens in the vocabulary
  for (const std::string& t : {std::string("<|user|> hi\n\n\t  x \xF0\x9F\x98\x80 \xE6\xBC\xA2\xE5\xAD\x97<|bot|>"), std::string("  \t\n\n lead"),
                              std::string("caf\xC3\xA9\r\n\xE2\x96\x81<|user")})
    CHECK(tok.decode(tok.encode(t)) == t);
  const auto a_train = decode_docs(tok, p.sources[0].train_path, p.sources[0].train_idx);
  REQUIRE(a_train.size() == 24);
  for (int i = 0; i < 24; ++i) CHECK(a_train[i] == text_docs[i]);
  const auto b_train = decode_docs(tok, p.sources[1].train_path, p.sources[1].train_idx);
  CHECK(b_train[0].find("caf\xC3\xA9 \xF0\x9F\x98\x80 \xE6\xBC\xA2\xE5\xAD\x97") != std::string::npos);  // NFC
  const auto code = decode_docs(tok, p.sources[2].train_path, p.sources[2].train_idx);
  CHECK(code[0] == "def f0(x):\n\treturn x + 0");  // tabs and newlines, byte for byte
  CHECK(troupe::read_doc_index(p.sources[2].val_idx).tokenizer_hash == p.tokenizer_hash);

  // reuse; then one thread gives the same bits; an interrupted run (no meta.json, litter) is redone
  CHECK(troupe::prepare_data(cfg, 600).from_cache);
  const std::string bin = slurp(p.sources[0].train_path), idx = slurp(p.sources[1].val_idx);
  fs::remove_all(p.dir);
  cfg.threads = 1;
  const auto one = troupe::prepare_data(cfg, 600);
  CHECK(one.dir == p.dir);  // data.threads is not part of the key
  CHECK(slurp(one.sources[0].train_path) == bin);
  CHECK(slurp(one.sources[1].val_idx) == idx);
  fs::remove(p.dir + "/meta.json");
  s.write(fs::relative(p.dir + "/a.scratch", s.dir).string(), "half");
  fs::resize_file(p.sources[0].train_path, 100);
  const auto redone = troupe::prepare_data(cfg, 600);
  CHECK_FALSE(redone.from_cache);
  CHECK(slurp(redone.sources[0].train_path) == bin);
  CHECK_FALSE(fs::exists(p.dir + "/a.scratch"));
  // a tokenizer made for another blend in a committed folder: refused, naming it
  fs::copy_file(p.dir + "/tokenizer.model", s.path("keep.model"));
  troupe::DataConfig other = cfg;
  other.sources.pop_back();
  const auto o = troupe::prepare_data(other, 600);
  fs::copy_file(o.tokenizer_path, p.tokenizer_path, fs::copy_options::overwrite_existing);
  CHECK_THROWS_WITH(troupe::prepare_data(cfg, 600), Contains("tokenizer.model") && Contains("delete"));
}

TEST_CASE("prepare: the old single-corpus keys are a one-source blend", "[datasets][blend]") {
  Scratch s("blend", "legacy");
  troupe::DataConfig cfg;
  cfg.corpus = kTiny;
  cfg.cache_dir = s.path("cache");
  cfg.val_fraction = 0.1;
  const auto p = troupe::prepare_data(cfg, 512);
  REQUIRE(p.sources.size() == 1);
  CHECK(p.sources[0].name == "corpus");
  CHECK(p.train_docs == 10);
  CHECK(p.val_docs == 1);
  // as before: the documents of read_corpus, tokenized in order
  const auto tok = troupe::Tokenizer::load(p.tokenizer_path);
  const auto split = troupe::split_documents(troupe::read_corpus(kTiny), 0.1);
  CHECK(troupe::TokenFile(p.sources[0].train_path).to_vector() == troupe::tokenize_documents(tok, split.train, 1));
  // the same file as a [[data.sources]] entry with the default cleaning: the 11 addresses
  // pass every filter and are their own NFC form, so the same tokens (another folder)
  troupe::DataConfig same = cfg;
  same.sources = {source("corpus", kTiny)};
  const auto q = troupe::prepare_data(same, 512);
  CHECK(q.dir != p.dir);
  CHECK(q.sources[0].report.docs_kept == 11);
  CHECK(slurp(q.sources[0].train_path) == slurp(p.sources[0].train_path));
}

// ---------------------------------------------------------------- tokenizer

TEST_CASE("tokenizer: word-by-word encoding (cached) gives SentencePiece's ids for the whole text", "[datasets][blend]") {
  Scratch s("blend", "words");
  const auto docs = troupe::read_corpus(kTiny);
  troupe::Tokenizer::train(docs, 700, s.path("tok"), {}, {"<|user|>"});
  const auto tok = troupe::Tokenizer::load(s.path("tok.model"));
  sentencepiece::SentencePieceProcessor sp;
  REQUIRE(sp.Load(s.path("tok.model")).ok());
  std::vector<std::string> texts(docs.begin(), docs.end());
  texts.push_back("  two  spaces\t\ttabs \n\n new  lines <|user|>x  <|user|> 1234 caf\xC3\xA9 \xE6\xBC\xA2\xE5\xAD\x97 end ");
  texts.push_back(" ");
  texts.push_back("a   ");
  for (int pass = 0; pass < 2; ++pass)  // the second pass comes from the cache
    for (const auto& t : texts) {
      std::vector<int> want;
      REQUIRE(sp.Encode(t, &want).ok());
      const auto got = tok.encode(t);
      CHECK(std::vector<int>(got.begin(), got.end()) == want);
    }
}

TEST_CASE("tokenizer: a word past 8 KiB is encoded in 8 KiB pieces, exactly and in bounded memory", "[datasets][blend]") {
  Scratch s("blend", "longword");
  const auto docs = troupe::read_corpus(kTiny);
  troupe::Tokenizer::train(docs, 700, s.path("tok"));
  const auto tok = troupe::Tokenizer::load(s.path("tok.model"));
  sentencepiece::SentencePieceProcessor sp;
  REQUIRE(sp.Load(s.path("tok.model")).ok());
  constexpr size_t K = troupe::Tokenizer::kMaxTrainSentenceBytes;
  // 100 KB without a space, multi-byte characters across the 8 KiB cuts, between two words
  std::string word;
  while (word.size() < 100000) word += "ab\xC3\xA9\xE6\xBC\xA2" "c";
  const std::string text = "before " + word + " after";
  const auto got = tok.encode(text);
  CHECK(tok.decode(got) == text);
  // SentencePiece's own ids for each word, the long one (" " + word, as encode splits words)
  // cut at the last character boundary at or before each K bytes
  std::vector<std::string> pieces = {"before"};
  std::string_view rest = std::string_view(text).substr(6, word.size() + 1);
  while (rest.size() > K) {
    size_t cut = K;
    while ((static_cast<unsigned char>(rest[cut]) & 0xC0) == 0x80) --cut;
    pieces.emplace_back(rest.substr(0, cut));
    rest.remove_prefix(cut);
  }
  pieces.emplace_back(rest);
  pieces.emplace_back(" after");
  CHECK(pieces.size() > 10);
  std::vector<int> want, ids;
  for (const auto& p : pieces) {
    REQUIRE(sp.Encode(p, &ids).ok());
    want.insert(want.end(), ids.begin(), ids.end());
  }
  CHECK(std::vector<int>(got.begin(), got.end()) == want);
}

// ---------------------------------------------------------------- loader

TEST_CASE("blend loader: weighted, deterministic per (seed, step), one source = BatchLoader", "[datasets][blend]") {
  Scratch s("blend", "loader");
  std::vector<int32_t> t1(5000), t2(5000);
  for (int i = 0; i < 5000; ++i) t1[i] = i % 100, t2[i] = 100 + i % 100;
  troupe::write_token_file(s.path("a.bin"), t1, 256, 7);
  troupe::write_token_file(s.path("b.bin"), t2, 256, 7);
  auto f = [&](const char* n) { return std::make_shared<const troupe::TokenFile>(s.path(n)); };
  troupe::BlendLoader blend({{"a", 3.0, f("a.bin"), f("a.bin")}, {"b", 1.0, f("b.bin"), f("b.bin")}});
  const int B = 4000, T = 8;
  std::vector<int32_t> in(B * T), tg(B * T), in2(B * T), tg2(B * T);
  blend.get_train_batch(1337, 5, B, T, in.data(), tg.data());
  int from_a = 0;
  for (int i = 0; i < B; ++i) from_a += in[i * T] < 100;
  CHECK(std::abs(from_a / double(B) - 0.75) < 0.03);
  for (int i = 0; i < B; ++i) CHECK((in[i * T] < 100) == (blend.sample_source(1337, 5, i) == 0));
  // a slice (a microbatch) equals the rows of the whole batch; another step differs
  blend.get_train_samples(1337, 5, 100, 10, T, in2.data(), tg2.data());
  CHECK(std::equal(in2.begin(), in2.begin() + 10 * T, in.begin() + 100 * T));
  blend.get_train_batch(1337, 6, B, T, in2.data(), tg2.data());
  CHECK(in2 != in);
  // one source: BatchLoader's batches
  troupe::BlendLoader one({{"a", 1.0, f("a.bin"), f("b.bin")}});
  troupe::BatchLoader plain(f("a.bin"), f("b.bin"));
  one.get_train_batch(9, 3, 16, T, in.data(), tg.data());
  plain.get_train_batch(9, 3, 16, T, in2.data(), tg2.data());
  CHECK(std::equal(in.begin(), in.begin() + 16 * T, in2.begin()));
  blend.get_val_batch(1, 0, 2, T, in.data(), tg.data());
  CHECK(in[0] == 100);
}

// ---------------------------------------------------------------- the command

namespace {

struct Run {
  int rc;
  std::string out, err;
};

// troupe prepare in the scratch folder (relative paths resolve there).
Run prepare(const Scratch& s, const std::string& config, const std::string& extra = "") {
  s.write("blend.toml", config);
  const std::string cmd = "cd '" + s.dir.string() + "' && timeout 120 '" + troupe::test::troupe_bin() +
                          "' prepare --config blend.toml --set data.cache_dir=cache --set model.vocab_size=400 " + extra +
                          " > out.txt 2> err.txt";
  const int st = std::system(cmd.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(s.path("out.txt")), slurp(s.path("err.txt"))};
}

void expect_refused(const Run& r, std::initializer_list<const char*> needles) {
  INFO("stderr: " << r.err);
  CHECK(r.rc == 2);
  const auto at = r.err.find("error: ");
  REQUIRE(at != std::string::npos);
  const std::string line = r.err.substr(at, r.err.find('\n', at) - at);
  for (auto* n : needles) CHECK(line.find(n) != std::string::npos);
}

std::string src(const std::string& name, const std::string& path, const std::string& more = "") {
  return "[[data.sources]]\nname = \"" + name + "\"\npath = \"" + path + "\"\n" + more;
}

}  // namespace

TEST_CASE("troupe prepare: report and table, and bad sources exit 2 naming the source and line", "[datasets][blend][cli]") {
  Scratch s("blend", "cli");
  std::mt19937_64 rng(5);
  const auto vocab = word_list(2000, 9);
  std::string good;
  for (int i = 0; i < 8; ++i) good += random_doc(vocab, 90, rng) + "\n\n";
  s.write("good.txt", good);
  Run ok = prepare(s, src("good", "good.txt"), "--report rep.json");
  INFO(ok.err);
  REQUIRE(ok.rc == 0);
  CHECK(ok.out.find("good") != std::string::npos);
  CHECK(nlohmann::json::parse(slurp(s.path("rep.json")))["sources"][0]["docs_kept"] == 8);
  CHECK(fs::exists(s.path("rep.removed.jsonl")));

  expect_refused(prepare(s, src("gone", "nope.txt")), {"source 'gone'", "nope.txt", "does not exist"});
  s.write("empty.txt", "");
  expect_refused(prepare(s, src("void", "empty.txt")), {"source 'void'", "empty"});
  s.write("latin1.txt", good + "caf\xe9 au lait\n");
  const std::string bad_line = "line " + std::to_string(std::count(good.begin(), good.end(), '\n') + 1) + " ";
  expect_refused(prepare(s, src("old", "latin1.txt")), {"source 'old'", bad_line.c_str(), "UTF-8", "utf8 = "});
  CHECK(prepare(s, src("old", "latin1.txt", "utf8 = \"replace\"\n")).rc == 0);
  s.write("bad.jsonl", "{\"text\": \"fine\"}\n{not json\n");
  expect_refused(prepare(s, src("j", "bad.jsonl", "format = \"jsonl\"\n")), {"source 'j'", "line 2", "not JSON"});
  s.write("nofield.jsonl", "{\"text\": \"fine\"}\n\n{\"body\": \"x\"}\n");
  expect_refused(prepare(s, src("j", "nofield.jsonl", "format = \"jsonl\"\n")), {"source 'j'", "line 3", "\"text\""});
  expect_refused(prepare(s, src("good", "good.txt", "weight = 0.0\n")), {"source 'good'", "weight"});
  s.write("one.txt", random_doc(vocab, 90, rng) + "\n");
  expect_refused(prepare(s, src("one", "one.txt")), {"source 'one'", "at least 2"});
  // none of the refused runs left a committed dataset behind
  int committed = 0;
  for (auto& e : fs::recursive_directory_iterator(s.path("cache")))
    committed += e.path().filename() == "meta.json";
  CHECK(committed == 2);  // good.txt, and latin1.txt with utf8 = "replace"
}

TEST_CASE("troupe train on a blend: validation loss per source, resume bitwise", "[datasets][blend][cli]") {
  Scratch s("blend", "train");
  // two sources cut from the tiny corpus: addresses 1-6 and 7-11
  const std::string all = slurp(kTiny);
  size_t cut = 0;
  for (int i = 0; i < 6; ++i) cut = all.find("\n\n", cut) + 2;
  s.write("early.txt", all.substr(0, cut));
  s.write("late.txt", all.substr(cut));
  std::string cfg = slurp(std::string(TROUPE_SOURCE_DIR) + "/configs/tiny.toml");
  cfg.replace(cfg.find("corpus = "), cfg.find('\n', cfg.find("corpus = ")) - cfg.find("corpus = "), "val_fraction = 0.2");
  cfg += src("early", "early.txt") + src("late", "late.txt", "weight = 3.0\n");
  s.write("blend.toml", cfg);
  auto train = [&](const std::string& run, const std::string& extra) {
    const std::string cmd = "cd '" + s.dir.string() + "' && timeout 300 '" + troupe::test::troupe_bin() +
                            "' train --config blend.toml --run-dir " + run +
                            " --set data.cache_dir=cache --set train.steps=4 --set train.eval_interval=2 "
                            "--set train.eval_batches=1 --set train.sample_tokens=0 --set checkpoint.interval=2 " +
                            extra + " > /dev/null 2> err.txt";
    const int st = std::system(cmd.c_str());
    INFO(slurp(s.path("err.txt")));
    REQUIRE(WIFEXITED(st));
    REQUIRE(WEXITSTATUS(st) == 0);
  };
  train("full", "");
  std::vector<nlohmann::json> full;
  for (std::istringstream in(slurp(s.path("full/metrics.jsonl"))); ;) {
    std::string line;
    if (!std::getline(in, line)) break;
    full.push_back(nlohmann::json::parse(line));
  }
  int evals = 0;
  std::map<int, std::string> loss;
  for (auto& j : full) {
    if (j.contains("val_loss_sources")) {
      ++evals;
      const auto& per = j["val_loss_sources"];
      REQUIRE(per.contains("early"));
      REQUIRE(per.contains("late"));
      CHECK(j["val_loss"].get<double>() == Approx((per["early"].get<double>() + per["late"].get<double>()) / 2));
      CHECK(per["early"].get<double>() != per["late"].get<double>());
    }
    if (j.contains("loss")) loss[j["step"].get<int>()] = j["loss"].dump();
  }
  CHECK(evals == 2);
  // resumed from step 2: steps 3 and 4 give the very same losses
  fs::create_directories(s.path("resumed"));
  train("resumed", "--resume full/checkpoints/step-00000002 --set checkpoint.dir=resumed/ckpt");
  std::map<int, std::string> again;
  for (std::istringstream in(slurp(s.path("resumed/metrics.jsonl"))); ;) {
    std::string line;
    if (!std::getline(in, line)) break;
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) again[j["step"].get<int>()] = j["loss"].dump();
  }
  REQUIRE(again.count(3) == 1);
  CHECK(again[3] == loss[3]);
  CHECK(again[4] == loss[4]);
}
