// Hostile inputs, issue 14's thirty-third trial (a fresh reviewer's 241 cases): a trace that
// does not keep its config was calibrated against a reused folder's config.toml (A); the
// umask check refused --help and --dump - (B); a process waiting on another's preparation
// blamed a stop (C, cli wording only); the hard CPU-time limit's stop named no fix (D); some
// fault switches took garbage (E); a no-break space in a --set key printed as a space (F);
// TROUPE_JOB_SECRET and TROUPE_JOB_SECRET_FILE could disagree silently (G); TROUPE_* rank
// variables silently overrode SLURM's (H).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial33";
}  // namespace

TEST_CASE("calibrating from a trace without its config in a folder of several configs is refused",
          "[cli][hostile][plan]") {
  Scratch s(kGroup, "calnoconfig");
  const std::string train = "train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=3 "
                            "--set train.eval_interval=0 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" +
                            s.path("run") + "' --trace '" + s.path("run/trace.json") + "'";
  fs::create_directories(s.path("run"));
  REQUIRE(run_troupe(train, s).rc == 0);
  REQUIRE(run_troupe(train + " --set model.n_embd=256", s).rc == 0);
  // the trace without otherData (an older troupe's, or re-saved by a viewer)
  REQUIRE(shell_status("python3 -c \"import json;t=json.load(open('" + s.path("run/trace.json") +
                       "'));t.pop('otherData');json.dump(t,open('" + s.path("run/trace.json") + "','w'))\"") == 0);
  expect_user_error(
      run_troupe("plan --config configs/tiny.toml --set cluster.gpu=cpu --calibrate '" + s.path("run") + "'", s),
      {"does not record the config of the run it measured", "config-", "trace the run again"});
}

TEST_CASE("help and output to standard output pass the umask check", "[cli][hostile]") {
  Scratch s(kGroup, "umaskhelp");
  if (!nobody_can_run()) {
    SUCCEED("no user nobody who can run the binary here: nothing to check");
    return;
  }
  auto as_nobody = [&](const std::string& args) {
    return shell_status("cd '" + std::string(TROUPE_SOURCE_DIR) + "' && su nobody -s /bin/sh -c 'umask 777; \"" +
                        troupe_bin() + "\" " + args + "' > /dev/null 2>&1");
  };
  for (const char* help : {"train --help", "prepare --help", "export --help", "simulate --dump - --schedule 1f1b "
                                                                                 "--stages 2 --microbatches 4"}) {
    INFO(help);
    CHECK(as_nobody(help) == 0);
  }
}

TEST_CASE("the hard CPU-time limit's stop names the limit and the fix", "[cli][hostile]") {
  Scratch s(kGroup, "xcpuhard");
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=100000 --set train.sample_tokens=0 "
                           "--set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run") + "'",
                           s, 120, "ulimit -t 3;");
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK(r.err.find("the CPU-time limit (ulimit -t)") != std::string::npos);
  CHECK(r.err.find("ulimit -t unlimited") != std::string::npos);
}

TEST_CASE("fault switches that could never fire, or half set, are refused", "[cli][hostile]") {
  Scratch s(kGroup, "faultenv2");
  const std::string train = "train --config configs/tiny.toml --set train.steps=2 --set train.sample_tokens=0 "
                            "--set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run") + "'";
  expect_user_error(run_troupe(train, s, 60, "TROUPE_FAULT_KILL_RANK=0 TROUPE_FAULT_KILL_STEP=99"),
                    {"TROUPE_FAULT_KILL_STEP='99' is not a whole number from 1 to 2"});
  expect_user_error(run_troupe(train, s, 60, "TROUPE_FAULT_KILL_STEP=1"),
                    {"TROUPE_FAULT_KILL_STEP is set but TROUPE_FAULT_KILL_RANK is not"});
  expect_user_error(run_troupe(train, s, 60, "TROUPE_FAULT_KILL_IN_SNAPSHOT=maybe"),
                    {"TROUPE_FAULT_KILL_IN_SNAPSHOT='maybe' is not a step"});
  expect_user_error(run_troupe(train, s, 60, "TROUPE_FAULT_IGNORE_REFUSAL=maybe"),
                    {"TROUPE_FAULT_IGNORE_REFUSAL='maybe' is neither 1 nor 0"});
  CHECK_FALSE(fs::exists(s.path("run")));
}

TEST_CASE("a no-break space in a --set key is shown and told to go", "[cli][hostile][config]") {
  Scratch s(kGroup, "nbsp");
  const Run r = run_troupe("train --config configs/tiny.toml --set \"$(printf 'train.steps\\302\\240=3')\"", s);
  expect_user_error(r, {"train.steps\\u{00A0}", "has spaces around it"});
}

TEST_CASE("two job secrets that disagree, and rank variables of two launchers that disagree, are refused",
          "[cli][hostile][launch]") {
  Scratch s(kGroup, "secrets");
  std::ofstream(s.path("secret")) << "0123456789abcdef0123\n";
  fs::permissions(s.path("secret"), fs::perms::owner_read | fs::perms::owner_write);
  const std::string train = "train --config configs/tiny.toml --set train.steps=2 --set train.sample_tokens=0 "
                            "--set fault.join_timeout_s=5 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" +
                            s.path("run") + "'";
  expect_user_error(run_troupe(train, s, 60,
                               "TROUPE_RANK=1 TROUPE_WORLD_SIZE=2 TROUPE_COORDINATOR=127.0.0.1:29999 "
                               "TROUPE_JOB_SECRET_FILE='" + s.path("secret") +
                                   "' TROUPE_JOB_SECRET=fedcba9876543210fedcba"),
                    {"TROUPE_JOB_SECRET and TROUPE_JOB_SECRET_FILE=", "give different secrets"});
  expect_user_error(run_troupe(train, s, 60, "SLURM_PROCID=1 SLURM_NTASKS=2 TROUPE_RANK=0 TROUPE_WORLD_SIZE=1"),
                    {"TROUPE_RANK/TROUPE_WORLD_SIZE say rank 0 of 1 but SLURM_PROCID/SLURM_NTASKS say 1 of 2"});
  // troupe launch inside an allocation (srun -n 1 troupe launch --nprocs 2): a larger TROUPE world is fine
  const Run inside = run_troupe("launch --nprocs 2 -- '" + troupe_bin() + "' train --config configs/tiny.toml --set "
                                "train.steps=1 --set train.sample_tokens=0 --set data.cache_dir='" + s.path("cache") +
                                "' --run-dir '" + s.path("inside") + "'",
                                s, 120, "SLURM_PROCID=0 SLURM_NTASKS=1");
  INFO(inside.err);
  CHECK(inside.rc == 0);
  CHECK_FALSE(fs::exists(s.path("run")));
}

// Trial 34 (a fresh reviewer's 150 cases, 4 failed in 3 findings): the trace without its
// config next to a single config.toml was calibrated without a word (A again); a no-break
// space in a --set value printed as a space (I); a misspelled fault switch was ignored (J).
TEST_CASE("calibrating from a trace without its config says which config it takes, a kept config not text is refused",
          "[cli][hostile][plan]") {
  Scratch s(kGroup, "calnote");
  const std::string train = "train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=3 "
                            "--set train.eval_interval=0 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" +
                            s.path("run") + "' --trace '" + s.path("run/trace.json") + "'";
  fs::create_directories(s.path("run"));
  REQUIRE(run_troupe(train, s).rc == 0);
  const std::string t = s.path("run/trace.json");
  REQUIRE(shell_status("python3 -c \"import json;t=json.load(open('" + t + "'));t.pop('otherData');json.dump(t,open('" +
                       t + "','w'))\"") == 0);
  const std::string plan = "plan --config configs/tiny.toml --set cluster.gpu=cpu --calibrate '" + s.path("run") + "'";
  const Run r = run_troupe(plan, s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("does not record the config of the run it measured") != std::string::npos);
  REQUIRE(shell_status("python3 -c \"import json;t=json.load(open('" + t + "'));t['otherData']={'troupe_config':5};"
                       "json.dump(t,open('" + t + "','w'))\"") == 0);
  expect_user_error(run_troupe(plan, s), {"otherData.troupe_config", "is not text", "trace the run again"});
}

TEST_CASE("a no-break space in a --set value is shown, and a misspelled fault switch is refused", "[cli][hostile]") {
  Scratch s(kGroup, "nbspvalue");
  expect_user_error(run_troupe("train --config configs/tiny.toml --set \"$(printf 'train.steps=3\\302\\240')\"", s),
                    {"must be an integer", "3\\u{00A0}"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=2 --run-dir '" + s.path("run") + "'",
                               s, 60, "TROUPE_FAULT_KILLRANK=0"),
                    {"TROUPE_FAULT_KILLRANK is no fault switch", "TROUPE_FAULT_KILL_RANK"});
  CHECK_FALSE(fs::exists(s.path("run")));
}

// Trial 35 (153 cases, 11 failed in 4 findings): a hollow config kept in a trace was trusted
// (A2); other non-ASCII spaces were shown raw (I2); other misspelled TROUPE_* names were
// ignored without a word (J2).
TEST_CASE("a config kept in a trace that is not the whole one troupe wrote is refused", "[cli][hostile][plan]") {
  Scratch s(kGroup, "calhollow");
  const std::string train = "train --config configs/tiny.toml --set train.sample_tokens=0 --set train.steps=3 "
                            "--set train.eval_interval=0 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" +
                            s.path("run") + "' --trace '" + s.path("run/trace.json") + "'";
  fs::create_directories(s.path("run"));
  REQUIRE(run_troupe(train, s).rc == 0);
  const std::string t = s.path("run/trace.json");
  for (const char* hollow : {"", "# nothing\\n", "[model]\\n"}) {
    INFO("kept config: " << hollow);
    REQUIRE(shell_status("python3 -c \"import json;t=json.load(open('" + t + "'));t['otherData']['troupe_config']='" +
                         hollow + "';json.dump(t,open('" + t + "','w'))\"") == 0);
    expect_user_error(run_troupe("plan --config configs/tiny.toml --set cluster.gpu=cpu --calibrate '" + s.path("run") +
                                     "'",
                                 s),
                      {"is not the whole config troupe wrote there", "trace the run again"});
  }
}

TEST_CASE("non-ASCII spaces in values are shown, and a misspelled TROUPE_ name is warned about", "[cli][hostile]") {
  Scratch s(kGroup, "spaces");
  expect_user_error(run_troupe("launch --nprocs \"$(printf '2\\302\\240')\" -- true", s), {"2\\u{00A0}"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set \"$(printf 'data.corpus=x\\342\\200\\207')\"", s),
                    {"x\\u{2007}"});
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 "
                           "--set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run") + "'",
                           s, 60, "TROUPE_WORLDSIZE=2");
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("warning: environment variable TROUPE_WORLDSIZE is not one troupe reads") != std::string::npos);
}

// Trial 36 (156 cases, 14 failed, all low, in 4 findings): a NUL in a TOML key cut the
// message (N); TROUPE_LOCAL_WORLD_SIZE went unchecked in a one-process run (L); export
// --format echoed its value unquoted (F); a loss scale set at fp32 did nothing silently (S).
TEST_CASE("a NUL in a config key, a bad local world size alone, an odd --format and a loss scale at fp32 are named",
          "[cli][hostile]") {
  Scratch s(kGroup, "trial36");
  s.write("n4.toml", "[train]\n\"st\\u0000eps\" = 3\n");
  expect_user_error(run_troupe("train --config '" + s.path("n4.toml") + "'", s),
                    {"unknown config key 'train.st\\x00eps' in", "remove it or use one of"});
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=1", s, 60,
                               "TROUPE_LOCAL_WORLD_SIZE=abc"),
                    {"TROUPE_LOCAL_WORLD_SIZE='abc' must be an integer"});
  expect_user_error(run_troupe("export --format 'safetensors ' '" + s.path("nosnap") + "' '" + s.path("o.st") + "'", s),
                    {"--format of troupe export is 'safetensors ', which starts or ends with a blank"});
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 "
                           "--set train.initial_loss_scale=1024 --set data.cache_dir='" + s.path("cache") +
                               "' --run-dir '" + s.path("run") + "'",
                           s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("do nothing with train.precision = \"fp32\"") != std::string::npos);
}

// Trial 37 (154 cases, 7 failed): the last snapshot failed on a full disk and the run ended
// "done", exit 0 (P08); TROUPE_LOCAL_RANK unchecked alone; hysteresis at fp32 said nothing.
TEST_CASE("a run whose last snapshot failed ends with exit 2 naming the newest snapshot", "[cli][hostile][checkpoint]") {
  Scratch s(kGroup, "lastsnap");
  std::string why;
  const std::string mnt = s.path("mnt");
  // 28 MiB holds the two snapshots this run keeps (about 10 MiB each), so it starts; once step
  // 20's is on disk the filesystem is filled, and the last save (step 40) fails
  const std::string ck = mnt + "/ck";
  if (!run_on_tmpfs(s, mnt, 28,
                    "set +e\n'" + troupe_bin() + "' train --config configs/tiny.toml --set train.sample_tokens=0 --set "
                    "train.steps=40 --set checkpoint.interval=20 --set data.cache_dir='" + s.path("cache") +
                        "' --set checkpoint.dir='" + ck + "' --run-dir '" + s.path("run") + "' > '" + s.path("out") +
                        "' 2> '" + s.path("err") + "' &\np=$!\nfor i in $(seq 1 1200); do [ -e '" + ck +
                        "/step-00000020/manifest.capnp' ] && break; sleep 0.05; done\ndd if=/dev/zero of='" + mnt +
                        "/fill' bs=1M > /dev/null 2>&1\nwait $p\necho $? > '" + s.path("rc") + "'",
                    &why)) {
    SUCCEED("no tmpfs in a mount namespace here (" << why << "): nothing to check");
    return;
  }
  const std::string err = slurp(s.path("err"));
  INFO(err);
  CHECK(slurp(s.path("rc")).substr(0, 1) == "2");
  CHECK(err.find("failed (") != std::string::npos);
  CHECK(err.find("steps 21 to 40 are in no snapshot") != std::string::npos);
  CHECK(err.find("free space on the filesystem of checkpoint.dir") != std::string::npos);  // the cause's fix
  CHECK(err.find("continue with --resume latest (the newest snapshot on disk is") != std::string::npos);
}

TEST_CASE("a local rank alone and hysteresis at fp32 are named", "[cli][hostile]") {
  Scratch s(kGroup, "localrank");
  expect_user_error(run_troupe("train --config configs/tiny.toml --set train.steps=1", s, 60, "TROUPE_LOCAL_RANK=7"),
                    {"TROUPE_LOCAL_RANK='7'"});
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set train.sample_tokens=0 "
                           "--set train.hysteresis=3 --set data.cache_dir='" + s.path("cache") + "' --run-dir '" +
                               s.path("run") + "'",
                           s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find("hysteresis do nothing") != std::string::npos);
}

TEST_CASE("a data source that fails mid-read names the cause and the fix", "[cli][hostile][data]") {
  Scratch s(kGroup, "procmem");
  // /proc/self/mem is a regular file that fails its first read (EIO): refused for the
  // filesystem it lies on (trial 38), before any read
  const Run r = run_troupe("train --config configs/tiny.toml --set train.steps=1 --set data.corpus=/proc/self/mem "
                           "--set data.cache_dir='" + s.path("cache") + "' --run-dir '" + s.path("run") + "'",
                           s);
  expect_user_error(r, {"'/proc/self/mem' lies on proc", "point data.corpus at a text file on disk"});
}
