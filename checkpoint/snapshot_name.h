// checkpoint/snapshot_name.h — which folder names are snapshots (step-<k>), and which are
// named so nearly like one that a user would take them for one (STEP-00000003, step-3.0):
// those troupe never reads, so it says so instead of passing them over.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

// The step k a snapshot folder's name "step-<k>" names: "step-" then 1..18 ASCII digits with
// a value >= 1 (leading zeros or not: "step-3" is "step-00000003"). -1 for every other name:
// "step-3.tmp-9", "step-3.kept", "STEP-3", "step-+3", "step- 3", "step-0". Pure; never throws.
int64_t snapshot_name_step(std::string_view name);

// For a name a user may take for a snapshot folder's but that troupe does not read as one —
// "step" in any case, then '-', '_', '.', a blank or nothing, then a number written another
// way: "STEP-00000003", "Step_3", "step3", "step-3.0", "step-0x3", "step-+3", "step- 3",
// "step-3 ", "step-٣" (Arabic-Indic or another script's decimal digits), "step-0" — the step
// that number is (>= 0), or -1 when it is none (a fraction such as "step-3.5", more than 18
// digits). std::nullopt for a snapshot's name (snapshot_name_step >= 1), for troupe's other
// names (step-<k>.tmp-<pid>, step-<k>.superseded / .unreadable / .kept [.n]) and for names
// that do not start so. Pure; never throws.
std::optional<int64_t> near_snapshot_name(std::string_view name);

// Whether `name` is one troupe gives a snapshot folder it is writing or has set aside:
// step-<k>.tmp-<pid>, step-<k>.superseded / .unreadable / .kept, each optionally .<n>. Pure.
bool set_aside_name(std::string_view name);

// The folders in ckpt_dir that hold a manifest.capnp (of any file type) under a name that is
// neither a snapshot's (step-<k>) nor one troupe sets aside (set_aside_name): a snapshot a
// user renamed (STEP-00000003, step-3.0, step-3 (copy), step-3-old, backup-step-3), which no
// --resume latest reads. Each as one sentence, "<path> is named like a snapshot (or: holds a
// snapshot manifest) but is not read as one (troupe reads only folders named step-<k>:
// lower-case "step-", then the step in the digits 0-9); if it is one, rename it
// <dir>/step-0000000k", k from the near name or else the manifest's step. Control characters
// in names are escaped (printable). Sorted; none when the folder cannot be listed. Never throws.
std::vector<std::string> near_named_snapshots(const std::string& ckpt_dir);

}  // namespace troupe
