// Hostile inputs, issue 14: trial 49's last two findings (low). A snapshot renamed by hand
// to a near name (STEP-00000003, step-3.0, step-0x3, step-+3, Arabic-Indic digits) was passed
// over without a word (L2); special tokens of punctuation ("..", "->", "||"), a word with a
// mark ("ab.") or a letter with a combining accent were accepted, and the no-break-space
// refusal's example repeated the value (L3).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "checkpoint/snapshot_name.h"
#include "cli_helpers.h"
#include "core/error.h"
#include "datasets/special_tokens.h"

namespace fs = std::filesystem;

namespace {
using namespace troupe::test;
const char* const kGroup = "hostile-trial50";


std::string refusal(const std::string& list) {
  return user_error_of([&] { troupe::parse_special_tokens(list); });
}
}  // namespace

TEST_CASE("snapshot names: step-<ASCII digits> only, near names recognised", "[checkpoint][names]") {
  using troupe::near_snapshot_name;
  using troupe::snapshot_name_step;
  CHECK(snapshot_name_step("step-00000003") == 3);
  CHECK(snapshot_name_step("step-3") == 3);
  CHECK(snapshot_name_step("step-123456789012345678") == 123456789012345678LL);
  for (const char* n : {"step-0", "step-", "step-+3", "step- 3", "step-3 ", "STEP-3", "step-3.tmp-9", "step-3.kept",
                        "step-1234567890123456789", "step-3.0", "xstep-3"})
    CHECK(snapshot_name_step(n) == -1);
  CHECK(near_snapshot_name("STEP-00000003") == 3);
  CHECK(near_snapshot_name("Step_3") == 3);
  CHECK(near_snapshot_name("step3") == 3);
  CHECK(near_snapshot_name("step-3.0") == 3);
  CHECK(near_snapshot_name("step-3.00") == 3);
  CHECK(near_snapshot_name("step-0x3") == 3);
  CHECK(near_snapshot_name("step-0X1f") == 31);
  CHECK(near_snapshot_name("step-+3") == 3);
  CHECK(near_snapshot_name("step- 3") == 3);
  CHECK(near_snapshot_name("step-3 ") == 3);
  CHECK(near_snapshot_name("step-\xD9\xA3") == 3);                // Arabic-Indic ٣
  CHECK(near_snapshot_name("step-\xEF\xBC\x91\xEF\xBC\x92") == 12);  // full-width １２
  CHECK(near_snapshot_name("step-0") == 0);
  CHECK(near_snapshot_name("step-3\n") == 3);  // (trial 50: a newline pasted in with the name)
  CHECK(near_snapshot_name("step-3\r\n") == 3);
  CHECK(near_snapshot_name("step-3.5") == -1);
  CHECK(near_snapshot_name("step-99999999999999999999") == -1);
  for (const char* n : {"step-00000003", "step-3.tmp-99", "step-3.kept", "step-3.kept.2", "step-3.superseded",
                        "step-3.unreadable.2", "step-3-copy", "step-notes", "steps", "stepper-3", "run-3", "step-0x"})
    CHECK_FALSE(near_snapshot_name(n).has_value());
}

TEST_CASE("a snapshot renamed to a near name is named, with the name to give it", "[cli][hostile]") {
  Scratch s(kGroup, "near");
  REQUIRE(run_troupe(tiny_train(s, "run", 3), s).rc == 0);
  const std::string ck = s.path("run/checkpoints");
  // the newest renamed by hand: latest takes step 2, and says why not step 3
  fs::rename(ck + "/step-00000003", ck + "/STEP-00000003");
  Run r = run_troupe(tiny_train(s, "run", 3, " --resume latest"), s);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err.find(ck + "/STEP-00000003 is named like a snapshot but is not read as one") != std::string::npos);
  CHECK(r.err.find("rename it " + ck + "/step-00000003") != std::string::npos);
  // only near names: the refusal names them, and how to rename
  Scratch t(kGroup, "nearonly");
  fs::create_directories(t.path("ck"));
  fs::copy(ck + "/STEP-00000003", t.path("ck/step-0x3"), fs::copy_options::recursive);
  fs::copy(ck + "/STEP-00000003", t.path("ck/step-\xD9\xA3"), fs::copy_options::recursive);
  r = run_troupe("train --config configs/tiny.toml --set train.steps=9 --set checkpoint.dir='" + t.path("ck") +
                     "' --run-dir '" + t.path("run") + "' --resume latest",
                 t);
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK(r.err.find("no usable snapshot in " + t.path("ck")) != std::string::npos);
  CHECK(r.err.find("is named like a snapshot but is not read as one") != std::string::npos);
  CHECK(r.err.find("rename it " + t.path("ck/step-00000003")) != std::string::npos);
  CHECK(r.err.find(t.path("ck/step-0x3") + " is named like a snapshot") != std::string::npos);  // (each named: trial 51)
  CHECK(r.err.find(t.path("ck/step-\xD9\xA3") + " is named like a snapshot") != std::string::npos);
  CHECK(r.err.find("lacks its manifest") == std::string::npos);  // (trial 50: no step-<k> folder is there)
  CHECK(fs::exists(t.path("ck/step-0x3/manifest.capnp")));  // (nothing moved)
}

TEST_CASE("special tokens must be marked off from ordinary text", "[data][hostile]") {
  CHECK(troupe::parse_special_tokens("<|user|>, <|bot|>,[INST],<s>,\xE3\x80\x90\xE7\x94\xA8\xE6\x88\xB7\xE3\x80\x91") ==
        std::vector<std::string>{"<|user|>", "<|bot|>", "[INST]", "<s>", "\xE3\x80\x90\xE7\x94\xA8\xE6\x88\xB7\xE3\x80\x91"});
  CHECK(troupe::parse_special_tokens("<|..|x>,{sep_1}").size() == 2);
  for (const char* t : {"..", "->", "||", "ab.", "e\xCC\x81", "<>", "<|>", "<=>", "<<a<", ">a<", "<s>\xCC\x81", "<\xE2\x80\x94>",
                        "<x]", "(x]", "[x)", "[x>", "\xE2\x80\xB9x\xC2\xBB"}) {  // (trial 50: mismatched pairs)
    const std::string why = refusal(t);
    INFO(t << ": " << why);
    CHECK((why.find("is not marked off from ordinary text") != std::string::npos ||
           why.find("is one character") != std::string::npos));
  }
  CHECK(refusal("ab.").find("e.g., \"<|ab.|>\"") != std::string::npos);
  CHECK(refusal("->").find("e.g., \"<|sep|>\"") != std::string::npos);
  // a no-break space: the example is the token without it, not the same text again
  const std::string nbsp = refusal("<a\xC2\xA0" "b>");
  INFO(nbsp);
  CHECK(nbsp.find("holds a space") != std::string::npos);
  CHECK(nbsp.find("e.g. \"<a_b>\"") != std::string::npos);
  CHECK(refusal("<a\xE2\x80\x8B" "b>").find("e.g. \"<a_b>\"") != std::string::npos);  // U+200B
}
