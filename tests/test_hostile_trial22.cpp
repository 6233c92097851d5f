// Hostile inputs, issue 14's twenty-second trial (a fresh reviewer's 137 cases): a FIFO where
// the peak cache belongs hung train (E06, high) and a folder there stopped it with a raw
// library error (E02/E10); data.special_tokens was ignored beside a given tokenizer (T04,
// high); a HOME that does not exist was created (E05); and the lows: a UTF-16 config, an
// lr of 1e308, CR-only line ends, weight = inf, a deleted current directory, sizes under a
// MiB, a script without execute permission.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli_helpers.h"
#include "core/text.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial22";
// a one-step tiny run whose data cache and run directory live in the scratch folder
std::string one_step(const Scratch& s, const std::string& run) {
  return "train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 --set train.eval_interval=0 "
         "--set train.eval_batches=1 --set data.cache_dir='" + s.path("c") + "' --run-dir '" + s.path(run) + "'";
}
}  // namespace

TEST_CASE("a peak cache that is a folder or a FIFO is named and skipped, the run goes on", "[cli][hostile]") {
  Scratch s(kGroup, "peak");
  fs::create_directories(s.path("dir/peak.json"));
  Run r = run_troupe(one_step(s, "a"), s, 120, "env TROUPE_CACHE_DIR='" + s.path("dir") + "'");
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("cannot use the peak cache") != std::string::npos);
  CHECK(r.err.find("it is a folder") != std::string::npos);
  CHECK(fs::is_directory(s.path("dir/peak.json")));  // left as it was
  fs::create_directories(s.path("fifo"));
  REQUIRE(::mkfifo(s.path("fifo/peak.json").c_str(), 0600) == 0);
  r = run_troupe(one_step(s, "b"), s, 120, "env TROUPE_CACHE_DIR='" + s.path("fifo") + "'");
  INFO(r.err);
  CHECK(r.rc == 0);  // (was: waiting for a writer forever)
  CHECK(r.err.find("it is a FIFO") != std::string::npos);
  CHECK(fs::is_fifo(s.path("fifo/peak.json")));
  // a HOME that does not exist is not created (a system user's /nonexistent)
  r = run_troupe("plan --config configs/tiny.toml --set cluster.gpu=cpu", s, 120,
                 "env -u TROUPE_CACHE_DIR -u XDG_CACHE_HOME HOME='" + s.path("nohome/x") + "'");
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK_FALSE(fs::exists(s.path("nohome")));
}

TEST_CASE("data.special_tokens that a given tokenizer does not hold as one piece are refused", "[cli][hostile][data]") {
  Scratch s(kGroup, "special");
  REQUIRE(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("probe") + "'", s).rc == 0);
  std::string model;
  for (auto& e : fs::recursive_directory_iterator(s.path("probe")))
    if (e.path().filename() == "tokenizer.model") model = e.path().string();
  REQUIRE_FALSE(model.empty());
  fs::copy_file(model, s.path("tok.model"));
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("c") +
                               "' --set data.tokenizer='" + s.path("tok.model") + "' --set 'data.special_tokens=<a>'", s),
                    {"data.special_tokens lists \"<a>\"", "does not hold as one piece", "leave data.tokenizer empty"});
  CHECK_FALSE(fs::exists(s.path("c")));
  // without the key the given tokenizer is used
  CHECK(run_troupe("prepare --config configs/tiny.toml --set data.cache_dir='" + s.path("c") + "' --set data.tokenizer='" +
                   s.path("tok.model") + "'", s).rc == 0);
}

TEST_CASE("a UTF-16 config, an lr above 1, weight = inf and eps = inf are refused, each named", "[cli][hostile]") {
  Scratch s(kGroup, "values");
  REQUIRE(shell_status("iconv -f UTF-8 -t UTF-16 '" + std::string(TROUPE_SOURCE_DIR) + "/configs/tiny.toml' > '" +
                       s.path("u16.toml") + "'") == 0);
  expect_user_error(run_troupe("train --config '" + s.path("u16.toml") + "'", s), {"is UTF-16 text", "iconv -f UTF-16"});
  // (a BOM-less UTF-16LE file too)
  REQUIRE(shell_status("printf 'a\\000b\\000c\\000d\\000e\\000' > '" + s.path("le.toml") + "'") == 0);
  expect_user_error(run_troupe("train --config '" + s.path("le.toml") + "'", s), {"is UTF-16 text"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set optim.lr=1e308", s),
                    {"optim.lr = 1e308 is above 1", "diverge"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set optim.eps=inf", s), {"finite number > 0"});
  s.write("w.toml", "[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nblock_size = 16\nvocab_size = 512\n"
                    "[train]\nseq_len = 16\n[[data.sources]]\nname = \"a\"\npath = \"tests/data/tiny_corpus.txt\"\nweight = inf\n");
  expect_user_error(run_troupe("train --config '" + s.path("w.toml") + "'", s), {"weight = inf", "finite number > 0"});
}

TEST_CASE("a corpus of CR-only line ends is named with its conversion, not blamed on the cleaning", "[cli][hostile][data]") {
  Scratch s(kGroup, "cr");
  std::string text;
  for (int d = 0; d < 50; ++d) text += "Document number " + std::to_string(d) + " has a line here.\r\r";
  s.write("mac.txt", text);
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set data.corpus='" + s.path("mac.txt") +
                               "' --set data.cache_dir='" + s.path("c") + "'", s),
                    {"holds 1 document(s)", "CR alone", "tr '\\r' '\\n'"});
}

TEST_CASE("a deleted current directory, a tiny free space, a script without execute permission: each named",
          "[cli][hostile]") {
  Scratch s(kGroup, "misc");
  fs::create_directories(s.path("gone"));
  const std::string corpus = std::string(TROUPE_SOURCE_DIR) + "/tests/data/tiny_corpus.txt";
  const std::string cfg = std::string(TROUPE_SOURCE_DIR) + "/configs/tiny.toml";
  expect_user_error(run_troupe("train --config '" + cfg + "' --set data.corpus='" + corpus + "' --set data.cache_dir='" +
                                   s.path("c") + "' --set train.steps=1",
                               s, 60, "cd '" + s.path("gone") + "' && rmdir '" + s.path("gone") + "' &&"),
                    {"the current directory no longer exists", "cd to an existing folder"});
  s.write("s.sh", "echo hi\n");
  ::chmod(s.path("s.sh").c_str(), 0644);
  expect_user_error(run_troupe("launch --nprocs 2 -- '" + s.path("s.sh") + "'", s),
                    {"the file is not executable", "chmod +x"});
  expect_user_error(run_troupe("launch --nprocs 2 -- '" + s.path("") + "'", s), {"it is a folder"});
}

TEST_CASE("size_text picks the unit that shows a size, wide_encoding names UTF-16 and UTF-32", "[hostile]") {
  using troupe::size_text;
  using troupe::wide_encoding;
  CHECK(size_text(0) == "0 bytes");
  CHECK(size_text(1023) == "1023 bytes");
  CHECK(size_text(8192) == "8.0 KiB");
  CHECK(size_text(3565158) == "3.4 MiB");
  CHECK(size_text(1288490189) == "1.2 GiB");
  CHECK(std::string(wide_encoding(std::string("\xFF\xFE\0\0a\0\0\0", 8))) == "UTF-32");
  CHECK(std::string(wide_encoding("\xFF\xFE" "a")) == "UTF-16");
  CHECK(std::string(wide_encoding(std::string("\0[\0m\0o\0d", 9))) == "UTF-16");
  CHECK(std::string(wide_encoding("[model]\nn_layer = 2\n")).empty());
  CHECK(std::string(wide_encoding(std::string("\x7F" "ELF\0\0\0\0", 8))).empty());
}

TEST_CASE("a complete data cache on a read-only mount is used without its lock", "[cli][hostile][data]") {
  Scratch s(kGroup, "rocache");
  const std::string mnt = s.path("mnt"), t = "'" + troupe_bin() + "'";
  const std::string common = " --config configs/tiny.toml --set data.cache_dir='" + mnt + "/c'";
  const std::string body = t + " prepare" + common + " > '" + s.path("prep.log") + "' 2>&1\n" +
                           "mount -o remount,ro '" + mnt + "'\n" +
                           "if " + t + " train" + common + " --set train.steps=1 --set train.sample_tokens=0 --set "
                           "train.eval_interval=0 --set train.eval_batches=1 --run-dir '" + s.path("run") + "' > /dev/null 2> '" +
                           s.path("train.err") + "'; then echo 0; else echo $?; fi > '" + s.path("train.rc") + "'\n" +
                           "if " + t + " prepare" + common + " --set data.val_fraction=0.2 > /dev/null 2> '" + s.path("other.err") +
                           "'; then echo 0; else echo $?; fi > '" + s.path("other.rc") + "'";  // (the script runs under set -e)
  std::string why;
  if (!run_on_tmpfs(s, mnt, 8, body, &why)) {
    SUCCEED("no mount namespace here (" << why << "): nothing to check");
    return;
  }
  INFO(slurp(s.path("tmpfs.log")) << slurp(s.path("prep.log")) << slurp(s.path("train.err")));
  CHECK(slurp(s.path("train.rc")) == "0\n");
  CHECK(slurp(s.path("train.err")).find("read-only: used without its lock") != std::string::npos);
  // another preparation (another key) on the read-only mount is refused, naming why
  CHECK(slurp(s.path("other.rc")) == "2\n");
  CHECK(slurp(s.path("other.err")).find("Read-only file system") != std::string::npos);
}
