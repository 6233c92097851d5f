// Hostile inputs, issue 14's thirty-eighth trial (a fresh reviewer's 168 cases, 24 failed, 0
// high): a failed snapshot's stop sent the user to --resume latest with no snapshot on disk and
// named "free space" for every cause (A); read errors of /proc files read as empty input (B);
// a run dir renamed mid-run split the run (C); an unwritable metrics.jsonl was blamed on a full
// disk (D); snapshot paths past PATH_MAX passed the start (E); sysfs and /proc corpora were
// said to change while read (F); and eleven low ones (messages and unused keys).
#include <catch2/catch.hpp>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/disk.h"
#include "cli_helpers.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial38";
}  // namespace

TEST_CASE("a failed snapshot names its cause's fix and what the next run starts from", "[hostile][checkpoint]") {
  Scratch s(kGroup, "snapfix");
  const std::string ck = s.path("ck");
  fs::create_directories(ck);
  CHECK(troupe::snapshot_failure_fix(EFBIG, ck).find("file-size limit") != std::string::npos);
  CHECK(troupe::snapshot_failure_fix(EMFILE, ck).find("ulimit -n") != std::string::npos);
  CHECK(troupe::snapshot_failure_fix(EROFS, ck).find("read-only") != std::string::npos);
  CHECK(troupe::snapshot_failure_fix(ENOSPC, ck).find("free space on the filesystem of checkpoint.dir (" + ck) !=
        std::string::npos);
  CHECK(troupe::snapshot_failure_fix(EACCES, ck).find("chattr -i") != std::string::npos);
  CHECK(troupe::snapshot_failure_fix(ENAMETOOLONG, ck).find("shorter checkpoint.dir") != std::string::npos);
  CHECK(troupe::snapshot_failure_fix(EXDEV, ck).find("(checkpoint.dir (" + ck + "))") != std::string::npos);
  // none on disk: never "--resume latest", which would refuse
  CHECK(troupe::after_snapshot_failure(ck).find("starts again from step 1") != std::string::npos);
  CHECK(troupe::after_snapshot_failure(ck).find("--resume") == std::string::npos);
  CHECK(troupe::after_snapshot_failure(s.path("nothing-here")).find("step 1") != std::string::npos);
}

TEST_CASE("a file that cannot be written is told its cause's fix", "[hostile]") {
  CHECK(troupe::write_error_fix(ENOSPC, "/r").find("Free space on that disk (df -h /r") != std::string::npos);
  CHECK(troupe::write_error_fix(EPERM, "/r").find("chattr -i") != std::string::npos);
  CHECK(troupe::write_error_fix(EPERM, "/r").find("Free space") == std::string::npos);
  CHECK(troupe::write_error_fix(EFBIG, "/r").find("ulimit -f") != std::string::npos);
  CHECK(troupe::write_error_fix(EROFS, "/r").find("read-only") != std::string::npos);
  CHECK(troupe::write_error_fix(0, "/r").find("ls -l /r") != std::string::npos);
  CHECK(troupe::write_error_fix(ELOOP, "/r").rfind("A symbolic link", 0) == 0);  // a sentence, capitalised
}
