// Hostile inputs, third part (issue 14's fourth trial): a signal during data preparation,
// a server at TROUPE_COORDINATOR that is not troupe's, and figures past what Cairo draws.
#include <catch2/catch.hpp>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/coordinator_probe.h"
#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using troupe::test::expect_user_error;
using troupe::test::Run;
using troupe::test::run_troupe;
using troupe::test::slurp;
using troupe::test::troupe_bin;
struct Scratch : troupe::test::Scratch {
  explicit Scratch(const std::string& name) : troupe::test::Scratch("hostile-peers", name) {}
};

// A TCP server on 127.0.0.1 (a free port) that answers every connection with `greeting`
// (nothing when empty) and keeps it open until the server ends.
struct FakeServer {
  int fd = -1;
  uint16_t port = 0;
  std::atomic<bool> stop{false};
  std::thread t;
  std::vector<int> clients;
  explicit FakeServer(std::string greeting) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, (sockaddr*)&a, sizeof a) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, (sockaddr*)&a, &len);
    port = ntohs(a.sin_port);
    REQUIRE(::listen(fd, 16) == 0);
    t = std::thread([this, greeting] {
      while (!stop) {
        const int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        if (!greeting.empty()) (void)!::send(c, greeting.data(), greeting.size(), MSG_NOSIGNAL);
        clients.push_back(c);
      }
    });
  }
  ~FakeServer() {
    stop = true;
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
    t.join();
    for (int c : clients) ::close(c);
  }
};
}  // namespace

TEST_CASE("the coordinator probe tells a CAF node from a silent or a foreign server, and a closed port", "[hostile][unit]") {
  using troupe::ProbeResult;
  {
    FakeServer http("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    const auto p = troupe::probe_coordinator("127.0.0.1", http.port, 2.0);
    CHECK(p.result == ProbeResult::kForeign);
    CHECK(p.detail.find("HTTP/1.1 400") != std::string::npos);
  }
  {
    FakeServer silent("");
    const auto t0 = std::chrono::steady_clock::now();
    const auto p = troupe::probe_coordinator("127.0.0.1", silent.port, 0.5);
    CHECK(p.result == ProbeResult::kSilent);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // a hang bound, not a timing check
  }
  {
    // a BASP server handshake header: operation 0, padding, payload 58 bytes, version 3
    std::string basp(32, '\0');
    basp[7] = 58;
    basp[15] = 3;
    FakeServer caf(basp);
    CHECK(troupe::probe_coordinator("127.0.0.1", caf.port, 2.0).result == ProbeResult::kCaf);
    basp[15] = 2;  // another BASP version is another program's protocol
    FakeServer old(basp);
    CHECK(troupe::probe_coordinator("127.0.0.1", old.port, 2.0).result == ProbeResult::kForeign);
  }
  uint16_t closed = 0;
  {
    FakeServer gone("");
    closed = gone.port;
  }
  CHECK(troupe::probe_coordinator("127.0.0.1", closed, 1.0).result == ProbeResult::kNoListener);
  CHECK(troupe::probe_coordinator("troupe-no-such-host.invalid", 1, 1.0).result == ProbeResult::kNoListener);
}

TEST_CASE("a process whose TROUPE_COORDINATOR is a server of another kind is refused at the join deadline, not left "
          "waiting forever",
          "[cli][hostile][multiprocess]") {
  Scratch s("foreign");
  for (const bool silent : {false, true}) {
    FakeServer server(silent ? "" : "SSH-2.0-OpenSSH_9.2\r\n" + std::string(40, 'x'));
    const auto t0 = std::chrono::steady_clock::now();
    const Run r = run_troupe("train --config configs/tiny.toml --set fault.join_timeout_s=4 --set data.cache_dir='" +
                                 s.path("cache") + "' --run-dir '" + s.path("run") + "'",
                             s, 120,
                             "env TROUPE_RANK=1 TROUPE_WORLD_SIZE=2 TROUPE_COORDINATOR=127.0.0.1:" +
                                 std::to_string(server.port) + " TROUPE_JOB_SECRET=0123456789abcdef0123456789abcdef");
    INFO("silent " << silent);
    expect_user_error(r, {"is not a troupe coordinator", "TROUPE_COORDINATOR"});
    // CAF's connect has no deadline of its own: without the watchdog this waited forever
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60));
    CHECK_FALSE(fs::exists(s.path("run")));
  }
}

TEST_CASE("SIGINT or SIGTERM during data preparation removes the partial cache, says so, and exits 2",
          "[cli][hostile][data]") {
  Scratch s("prepsig");
  {
    // ~16 MB of text: the tokenizer's training takes seconds, time to be interrupted
    std::mt19937 rng(7);
    std::ofstream f(s.path("corpus.txt"));
    const char* words[] = {"union", "state", "people", "congress", "nation", "freedom", "the", "of", "and", "work"};
    for (int d = 0; d < 2600; ++d) {
      for (int w = 0; w < 1000; ++w) f << words[rng() % 10] << (rng() % 7 ? "" : std::to_string(rng() % 1000)) << ' ';
      f << "\n\n";
    }
  }
  for (const char* sig : {"INT", "TERM"}) {
    const std::string cache = s.path(std::string("cache") + sig);
    const std::string cmd =
        "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && timeout 120 '" + troupe_bin() +
        "' prepare --config configs/tiny.toml --set model.vocab_size=2048 --set data.corpus='" + s.path("corpus.txt") +
        "' --set data.cache_dir='" + cache + "' 2> '" + s.path("err") + "' & p=$!; for i in $(seq 1 600); do grep -q " +
        "'training BPE tokenizer' '" + s.path("err") + "' && break; sleep 0.05; done; sleep 0.3; kill -" + sig +
        " $p; wait $p; echo $? > '" + s.path("rc") + "'";
    troupe::test::shell_status(cmd);
    const std::string err = slurp(s.path("err"));
    INFO(sig << ": " << err);
    if (err.find("data: 1 source(s)") != std::string::npos) {  // finished before the signal: nothing to check
      WARN("the preparation finished before the signal; machine too fast for this corpus");
      continue;
    }
    expect_user_error(Run{std::atoi(slurp(s.path("rc")).c_str()), err},
                      {"stopped by SIG", "while preparing the data", "partial files were removed"});
    CHECK_FALSE(fs::exists(cache));  // the folder it made, with its .lock and scratch files
  }
}

TEST_CASE("simulate draws a timeline of 600 stages (Cairo refuses pictures over 32767 pixels) and writes its trace",
          "[cli][hostile][simulate]") {
  Scratch s("bigpng");
  const Run r = run_troupe("simulate --stages 600 --microbatches 2 --quiet --png '" + s.path("t.png") + "' --trace '" +
                               s.path("t.json") + "'",
                           s);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const std::string png = slurp(s.path("t.png"));
  REQUIRE(png.size() > 24);
  CHECK(png.substr(12, 4) == "IHDR");
  const uint32_t height = (uint8_t)png[20] << 24 | (uint8_t)png[21] << 16 | (uint8_t)png[22] << 8 | (uint8_t)png[23];
  CHECK(height <= 16000);
  CHECK(height >= 600 * 4);
  const auto j = nlohmann::json::parse(slurp(s.path("t.json")));
  CHECK(j["traceEvents"].size() == 600 + 600 * 2 * 2);
  CHECK(j["otherData"]["P"] == 600);
}

TEST_CASE("the fifth trial's classes: links in a run directory, huge sizes, process limits, names, repeats, numbers",
          "[cli][hostile]") {
  Scratch s("fifth");
  const std::string cache = " --set data.cache_dir='" + s.path("cache") + "'";
  // a snapshot and a run directory to work on
  REQUIRE(run_troupe("train --config configs/tiny.toml --set train.steps=1 --set checkpoint.interval=1 --set "
                     "train.sample_tokens=0" + cache + " --run-dir '" + s.path("run") + "'",
                     s)
              .rc == 0);
  const std::string snap = s.path("run/checkpoints/step-00000001");
  REQUIRE(fs::exists(snap));
  {  // a link among a run directory's files is refused; the file it points to stays as it was
    fs::create_directories(s.path("linked"));
    s.write("victim.txt", "keep me\n");
    fs::create_symlink(s.path("victim.txt"), s.path("linked/metrics.jsonl"));
    expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=1" + cache + " --run-dir '" +
                                     s.path("linked") + "'",
                                 s),
                      {"symbolic link", "metrics.jsonl"});
    CHECK(slurp(s.path("victim.txt")) == "keep me\n");
  }
  // sizes at the edge of int: refused at once with a sentence, never a SIGFPE or a negative suggestion
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.batch_size=2147483647" + cache, s, 60),
                    {"train.batch_size = 2147483647", "1 to"});
  {
    const Run r = run_troupe("train --config configs/tiny.toml --set model.n_embd=2147483647" + cache, s, 60);
    expect_user_error(r, {"model.n_embd"});
    CHECK(r.err.find("-2147483648") == std::string::npos);
  }
  // an address-space limit too small to start: one sentence, not an abort or a hang
  expect_user_error(run_troupe("generate '" + snap + "' --tokens 3", s, 60, "ulimit -v 400000;"), {"ulimit -v"});
  // a file-size limit: export fails with a sentence (EFBIG, not SIGXFSZ) and leaves no temporary file
  {
    const Run r = run_troupe("export '" + snap + "' '" + s.path("x.safetensors") + "'", s, 60, "ulimit -f 100;");
    INFO(r.err);
    CHECK((r.rc == 1 || r.rc == 2));
    CHECK(r.err.find("error: ") == 0);
    bool tmp = false;
    for (auto& e : fs::directory_iterator(s.dir)) tmp = tmp || e.path().filename().string().find(".tmp-") != std::string::npos;
    CHECK_FALSE(tmp);
    CHECK_FALSE(fs::exists(s.path("x.safetensors")));
  }
  // a trace of the wrong shape for plan --calibrate
  fs::create_directories(s.path("cal"));
  fs::copy_file(s.path("run/config.toml"), s.path("cal/config.toml"));
  s.write("cal/trace.json", "{\"traceEvents\":[1,2,3,{\"ph\":\"X\",\"args\":{\"step\":\"two\"}}]}");
  expect_user_error(run_troupe("plan --config configs/tiny.toml --set cluster.gpu=cpu --calibrate '" + s.path("cal") + "'", s),
                    {"--calibrate", "wrong type"});
  // TROUPE_LAUNCH_ID names a folder under runs/: a path is refused
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=1" + cache, s, 60,
                               "env TROUPE_LAUNCH_ID=../../tmp/evil"),
                    {"TROUPE_LAUNCH_ID"});
  // an output name longer than a file system takes
  expect_user_error(run_troupe("export '" + snap + "' '" + s.path(std::string(300, 'x') + ".safetensors") + "'", s),
                    {"235 bytes"});
  // an option given twice to troupe launch
  expect_user_error(run_troupe("launch --nprocs 1 --nprocs 2 -- true", s), {"--nprocs is given twice"});
  // numbers the TOML parser or stod would not take are still numbers
  CHECK(run_troupe("simulate --quiet --cost f=1e-320,b=2", s).rc == 0);
  CHECK(run_troupe("train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 --set optim.lr=0." +
                       std::string(500, '1') + cache + " --run-dir '" + s.path("run-lr") + "'",
                   s)
            .rc == 0);
  // a title with a newline is named as such (it reached gnuplot and was blamed on the figure's size)
  expect_user_error(run_troupe("plot '" + s.path("run") + "' --out '" + s.path("p.png") + "' --title \"$(printf 'a\\nb')\"", s),
                    {"--title", "control character"});
  // both stdout and stderr closed: the output has nowhere to go, exit 2 (not 0 with the text lost)
  CHECK(troupe::test::shell_status("'" + troupe_bin() + "' generate '" + snap + "' --tokens 3 >&- 2>&-") == 2);
}

TEST_CASE("Ctrl-C during the end-of-run sample ends the sample, and the run finishes", "[cli][hostile]") {
  Scratch s("samplesig");
  const std::string cmd = "cd '" + std::string(TROUPE_SOURCE_DIR) + "' && timeout 120 '" + troupe_bin() +
                          "' train --config configs/tiny.toml --set train.steps=2 --set train.sample_tokens=100000 "
                          "--set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run") + "' 2> '" +
                          s.path("err") + "' & p=$!; for i in $(seq 1 600); do grep -qE 'step +2/2' '" + s.path("err") +
                          "' && break; sleep 0.1; done; sleep 1; kill -INT $p; wait $p; echo $? > '" + s.path("rc") + "'";
  troupe::test::shell_status(cmd);
  const std::string err = slurp(s.path("err"));
  INFO(err);
  CHECK(std::atoi(slurp(s.path("rc")).c_str()) == 0);
  CHECK(err.find("the sample stops after") != std::string::npos);
}

TEST_CASE("the sixth trial's classes: nesting that overflowed the TOML parser, control characters in config strings "
          "and the coordinator address, the CPU-time limit",
          "[cli][hostile]") {
  Scratch s("sixth");
  const std::string cache = " --set data.cache_dir='" + s.path("cache") + "'";
  {  // a key of 50,000 dotted parts, and 100,000 nested brackets: refused, not a stack overflow (SIGSEGV)
    std::string key;
    for (int i = 0; i < 50000; ++i) key += i ? ".a" : "a";
    s.write("deep.toml", key + " = 1\n");
    expect_user_error(run_troupe("train --config '" + s.path("deep.toml") + "'", s, 60), {"nests deeper than 64"});
    s.write("deep2.toml", "v = " + std::string(100000, '[') + std::string(100000, ']') + "\n");
    expect_user_error(run_troupe("simulate --quiet --config '" + s.path("deep2.toml") + "'", s, 60), {"nests deeper"});
    expect_user_error(run_troupe("train --config configs/tiny.toml --set 'train.steps=" + std::string(5000, '[') + "'", s, 60),
                      {"nests deeper"});
  }
  // NUL (cut the path short silently), escapes (reached the terminal) and newlines (forged log lines) in strings
  expect_user_error(run_troupe("prepare --config configs/tiny.toml --set 'data.corpus=\"tests/data/tiny_corpus.txt\\u0000.x\"'" +
                                   cache,
                               s, 60),
                    {"data.corpus", "control character"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set 'checkpoint.dir=\"/tmp/x\\nerror: fake\"'" + cache, s, 60),
                    {"checkpoint.dir", "control character"});
  s.write("esc.toml", "[data]\ncache_dir = \"/tmp/a\\u001b[2J\"\n");
  expect_user_error(run_troupe("train --config '" + s.path("esc.toml") + "'", s, 60), {"data.cache_dir", "control character"});
  expect_user_error(run_troupe("train --config configs/tiny.toml" + cache, s, 60,
                               "env TROUPE_RANK=1 TROUPE_WORLD_SIZE=2 TROUPE_COORDINATOR=\"$(printf '127.0.0.1\\033[2J:29959')\" "
                               "TROUPE_JOB_SECRET=0123456789abcdef0123456789abcdef"),
                    {"TROUPE_COORDINATOR"});
  // the soft CPU-time limit (SIGXCPU) far below an unlimited hard one (a batch system's
  // warning): the run stops as SIGTERM stops it, saving the step under way (trial 32, F1:
  // it ended at once with the steps since the last snapshot lost)
  {
    const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=100000 --set train.sample_tokens=0" +
                                 cache + " --run-dir '" + s.path("run") + "'",
                             s, 120, "ulimit -S -t 2;");
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(r.err.find("SIGXCPU") != std::string::npos);
    CHECK(r.err.find("saving a snapshot") != std::string::npos);
    bool snapshot = false;
    for (auto& e : fs::directory_iterator(s.path("run/checkpoints")))
      snapshot = snapshot || e.path().filename().string().rfind("step-", 0) == 0;
    CHECK(snapshot);
  }
  // a dotted key inside an inline table nests as deep
  std::string inl = "[train]\nx = { ";
  for (int i = 0; i < 200000; ++i) inl += i ? ".a" : "a";
  s.write("inline.toml", inl + " = 1 }\n");
  expect_user_error(run_troupe("train --config '" + s.path("inline.toml") + "'", s, 60), {"nests deeper"});
  // a failed run keeps a dangling link on its --run-dir path (it was taken for a folder the run made)
  fs::create_symlink("/no/such/mount/runs", s.path("rl"));
  CHECK(run_troupe("train --config configs/tiny.toml --set train.steps=1" + cache + " --run-dir '" + s.path("rl/r1") + "'", s, 60)
            .rc == 2);
  CHECK(fs::is_symlink(s.path("rl")));
}
