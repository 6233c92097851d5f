// cli/train_checks.h — what `troupe train` refuses before it writes anything: a coordinator
// address that does not resolve or cannot be listened on, a thread budget past the process
// limit (ulimit -u) or the machine, a checkpoint.dir that cannot be created or has no room
// for one snapshot, a job secret that is missing or short. Each throws troupe::UserError
// naming the fix (exit 2).
#pragma once
#include <string>

#include "core/config.h"
#include "core/launch_env.h"

namespace troupe::cli {

// Every process of several: refuses a coordinator host name that does not resolve (a
// permanent resolver answer; a temporary one, EAI_AGAIN, is warned about and the join
// retries until fault.join_timeout_s). Process 0 also refuses an address it cannot listen on.
void check_coordinator_address(const LaunchEnv& launch);
// Refuses a job whose processes on this host need more threads than the process limit
// (RLIMIT_NPROC, which counts every thread of the user) leaves; root is not held to it.
void check_thread_limit(const Config& c, const LaunchEnv& launch);
// Refuses (UserError, naming `fix`) a command needing about `need` more threads than its
// pids cgroup lets start (core/peak.h cgroup_tasks_left; a limit that binds root too).
void check_cgroup_tasks(long need, const std::string& fix);
// An explicit checkpoint.dir: created and probed with a file, then removed again; refused
// when it cannot be created or written.
void check_checkpoint_dir(const std::string& ckpt_dir);
// Folders that belong to something else: a checkpoint.dir that is another run's run
// directory (its config.toml and metrics.jsonl; the run's own `run_dir` may be it) or holds
// the run's corpus, sources or tokenizer; a run directory or checkpoint.dir that holds the
// --config file (`config_path`; but for <run_dir>/config.toml, the config a run saves) or the data; a train.tensorboard_dir that holds snapshots.
// Throws UserError naming the folder and what to pass instead.
void check_folder_roles(const Config& c, const std::string& run_dir, const std::string& ckpt_dir,
                        const std::string& config_path);
// data.cache_dir must be a folder for caches alone (trial 53, F3; prepare too, trial 55): not
// inside a prepared cache (cache/<hash>-v<V>, whose files train reads), not another run's
// directory (config.toml beside metrics.jsonl), not a folder of snapshots (each run's retention
// and the cache's cleanup would meet). "" passes. Throws UserError naming a folder to use.
void check_cache_dir_role(const std::string& cache_dir);
// A run directory that is, lies inside, or holds at most two levels down a prepared data
// cache (datasets/cache_folder.h is_prepared_cache): a run's records there would make the
// caches' folder a run directory, which data.cache_dir then refuses (trials 54, 55). ""
// passes. Throws UserError (pass a new folder, or move the cache out to continue a run).
void check_run_dir_holds_no_cache(const std::string& run_dir);
// train.device = "cuda": refused, naming why — no usable GPU (the CUDA runtime's answer, or
// a build without CUDA), or, with a GPU, that the stage and shard workers do not run on
// GPUs yet (issue 16). "cpu": nothing to check.
void check_device(const Config& c);
// Refuses more threads (train.threads) or stage workers than this machine runs in a sane time.
void check_machine_fits(const Config& c, const LaunchEnv& launch);
// Refuses (UserError) a checkpoint.dir without room for one snapshot, or for the snapshots
// that retention keeps plus the one being written when the run's periodic saves reach that
// many (checkpoint/disk.h first_failing_save; the snapshots already there count once
// retention removes them); warns when only a stop signal's extra save would not fit.
// Also refuses a file-size limit (ulimit -f) or free inodes short of one snapshot's files.
void check_snapshot_space(const Config& c, const std::string& ckpt_dir);
// A job of several processes (launch.world > 1): returns its secret (TROUPE_JOB_SECRET, else
// the first line of TROUPE_JOB_SECRET_FILE; at least 16 characters), after checking that the
// workers spread evenly over the processes and the coordinator's address
// (check_coordinator_address). "" for one process.
std::string check_job_of_several(const Config& c, const LaunchEnv& launch);
// Everything train refuses before the data is prepared and anything is written: the
// schedule, the GEMM library (TROUPE_GEMM), the outputs (--trace, --trace-png,
// --tensorboard), the machine, checkpoint.dir's space (process 0), threads and the device.
// Sets up console logging; warns about a thread count that oversubscribes the cores.
void check_before_writing(const Config& c, const LaunchEnv& launch, bool follower, const std::string& ckpt_dir);

}  // namespace troupe::cli
