#include "actors/checkpointer.h"

#include <signal.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <map>

#include "actors/messages.h"
#include "checkpoint/snapshot.h"
#include "core/error.h"
#include "core/interrupt.h"

namespace fs = std::filesystem;

namespace troupe {

namespace {
// The errno of a failed system call (SystemError, std::filesystem's error), else 0.
int system_error_code(const std::exception& e) {
  if (auto* se = dynamic_cast<const SystemError*>(&e)) return se->code();
  if (auto* fe = dynamic_cast<const fs::filesystem_error*>(&e)) return fe->code().value();
  return 0;
}
}  // namespace

void checkpoint_writer(caf::blocking_actor* self, CoordinatorActor coordinator, int keep_last, int64_t fault_kill_step) {
  using Clock = std::chrono::steady_clock;
  struct Pending {
    std::vector<ShardData> queue;  // received, not yet written
    bool begun = false;
    ManifestInfo info;
    int expected = 0, handled = 0;
    std::string ckpt_dir, tmp;
    std::vector<FileEntry> files;
    std::string error;
    int code = 0;  // the failure's errno, when a system call failed
    uint64_t bytes = 0;
    Clock::time_point t0 = Clock::now();
  };
  std::map<int64_t, Pending> pending;
  // Writes what can be written for step k; commits the snapshot once every shard is in.
  auto progress = [&](int64_t k) {
    Pending& p = pending[k];
    if (!p.begun) return;
    for (auto& s : p.queue) {
      if (p.error.empty()) {
        try {
          FileEntry e = write_shard_file(p.tmp, s);
          p.bytes += e.bytes;
          p.files.push_back(e);
          if (k == fault_kill_step) ::kill(::getpid(), SIGKILL);  // fault injection (tests)
        } catch (const std::exception& e) {
          p.error = e.what();
          p.code = system_error_code(e);
        }
      }
      ++p.handled;
      s = ShardData();  // the host copy is freed as soon as it is on disk
    }
    p.queue.clear();
    if (p.handled < p.expected) return;
    SnapDone d;
    d.dir = p.ckpt_dir + "/" + snapshot_name(k);
    if (p.error.empty()) {
      try {
        if (!p.info.tokenizer_path.empty()) p.files.push_back(write_tokenizer_copy(p.tmp, p.info.tokenizer_path));
        std::sort(p.files.begin(), p.files.end(), [](auto& a, auto& b) { return a.name < b.name; });
        write_manifest(p.tmp, p.info, p.files);
        p.bytes += fs::file_size(p.tmp + "/manifest.capnp");
        // a forced stop emptying the folder meanwhile (a second signal): no rename of what it left
        if (!claim_partial_dir(p.tmp)) throw Error("stopped while the snapshot was being written");
        // a complete snapshot of this step already there is of the line this run left when it
        // resumed an earlier one: set aside with the later ones (every step >= k, once, before the
        // rename), never replaced (trial 47, L4)
        d.superseded = set_aside_later_steps(p.ckpt_dir, k - 1);
        d.kept_aside = commit_snapshot(p.tmp, d.dir, &d.unsynced);
        d.ok = true;
        d.deleted = apply_retention(p.ckpt_dir, keep_last, k, &d.not_deleted);
      } catch (const std::exception& e) {
        p.error = e.what();
        p.code = system_error_code(e);
      }
    }
    if (!d.ok) {
      std::error_code ec;
      fs::remove_all(p.tmp, ec);  // never taken for a snapshot (no manifest), but free the space
      std::error_code gone;
      if (ec && fs::exists(fs::symlink_status(p.tmp, gone)))  // (out of file descriptors: EMFILE, trial 38)
        p.error += "; its unfinished folder " + p.tmp + " could not be removed (" + ec.message() +
                   "): the next run in this checkpoint.dir removes it";
      d.error = p.error;
      d.code = p.code;
    }
    forget_partial_dir(p.tmp);  // renamed into the snapshot, or removed
    d.bytes = p.bytes;
    d.write_s = std::chrono::duration<double>(Clock::now() - p.t0).count();
    self->send(coordinator, snapdone_atom::value, k, std::move(d));
    pending.erase(k);
  };
  bool running = true;
  auto on_shard = [&](shard_atom, int64_t k, ShardData& s) {
    Pending& p = pending[k];
    if (p.handled == 0 && p.queue.empty()) p.t0 = Clock::now();
    p.queue.push_back(std::move(s));
    progress(k);
  };
  auto on_begin = [&](snapbeg_atom, int64_t k, ManifestInfo& info, int expected, std::string& ckpt_dir) {
    Pending& p = pending[k];
    p.begun = true;
    p.info = std::move(info);
    p.expected = expected;
    p.ckpt_dir = ckpt_dir;
    p.tmp = ckpt_dir + "/" + snapshot_name(k) + ".tmp-" + std::to_string(::getpid());
    std::error_code ec;
    fs::create_directories(ckpt_dir, ec);
    fs::remove_all(p.tmp, ec);
    ec.clear();
    fs::create_directories(p.tmp, ec);
    if (ec) p.error = "cannot create " + p.tmp + ": " + ec.message(), p.code = ec.value();
    else note_partial_dir(p.tmp);  // a stop that ends the process at once removes it (core/interrupt.h)
    progress(k);
  };
  auto on_stop = [&](stop_atom) { running = false; };
  check_handlers<WriterActor>(on_shard, on_begin, on_stop);  // exactly its interface (actors/interfaces.h)
  self->receive_while(running)(on_shard, on_begin, on_stop);
}

KeeperActor::behavior_type memory_keeper(KeeperActor::pointer self, std::shared_ptr<MemoryStore> store,
                                         std::function<void(int64_t k, int rank, const std::vector<float>& words)> to_peer,
                                         std::vector<int> ranks, Topology topo) {
  return {
      [=](shard_atom, int64_t k, ShardData& s) {
        const int r = topo.rank({s.dp, s.pp, s.tp});
        auto kept = std::make_shared<const ShardData>(std::move(s));
        store->put_shard(k, r, kept);
        if (!to_peer) return;
        try {
          to_peer(k, r, encode_shard(*kept, MemoryInfo{}));
        } catch (const std::exception& e) {
          spdlog::warn("memory snapshot of step {}: the copy of rank {} did not reach its peer: {}", k, r, e.what());
        }
      },
      [=](peershard_atom, int64_t k, int32_t r, const Tensor& t) {
        try {
          store->put_shard(k, r, std::make_shared<const ShardData>(decode_shard(t.data(), (size_t)t.numel(), nullptr)));
        } catch (const std::exception& e) {
          spdlog::warn("memory snapshot of step {}: dropped the peer's copy of rank {}: {}", k, r, e.what());
        }
      },
      [=](meminfo_atom, int64_t k, int64_t updates, uint64_t scale_bits, int32_t growth, int32_t hysteresis) {
        MemoryInfo info;
        info.step = k;
        info.updates = updates;
        std::memcpy(&info.loss_scale, &scale_bits, sizeof scale_bits);
        info.growth_tracker = growth;
        info.hysteresis_tracker = hysteresis;
        store->expect(k, info, ranks);
      },
      [=](stop_atom) { self->quit(); },
  };
}

}  // namespace troupe
