// cli/launch.h — `troupe launch`: starts the processes of a job on this host (like
// torchrun's standalone mode) and waits for them. docs/launch.md is the user's guide.
//
//   troupe launch --nprocs N [--coordinator HOST:PORT] [--grace SECONDS]
//                 [--respawn process|job] -- COMMAND [ARGS...]
//
// Each of the N children runs COMMAND (execvp, so COMMAND is looked up in PATH) with the
// launcher's environment plus the contract read by core/launch_env.h:
//   TROUPE_RANK=r, TROUPE_WORLD_SIZE=N, TROUPE_LOCAL_RANK=r   (r = 0 .. N-1)
//   TROUPE_COORDINATOR=HOST:PORT   (default 127.0.0.1 and a port free when the launcher
//                                   started; rank 0 listens there)
//   TROUPE_JOB_SECRET=<64 hex>     (32 random bytes from getrandom(2); an already set
//                                   TROUPE_JOB_SECRET is passed through unchanged)
//   TROUPE_LOCAL_WORLD_SIZE=N, TROUPE_LAUNCH_ID=<timestamp>-<launcher pid> (same for every start)
//   TROUPE_RESPAWN=process|job     (the --respawn mode: how a lost process comes back)
//   TROUPE_RESTART_COUNT=k         (0 on the first start; see below)
//   TROUPE_FAILURE_TIME=<unix s>   (only when k > 0: when the loss this start recovers from
//                                   happened, unix_seconds() of core/events.h)
// These replace any TROUPE_* of the same name the launcher inherited.
//
// Respawn (a process is "lost" when a signal kills it or it exits 75, troupe train's
// "start me again" under fault.policy = restart):
//   --respawn process (default): a lost process is started again alone, at once or after its
//     back-off (--respawn-backoff, launch_attempt.h backoff_delay), with the
//     environment of its first start except TROUPE_RESTART_COUNT = k, the number of respawns
//     in this launch so far (over all ranks: 1, 2, ...), and TROUPE_FAILURE_TIME = when it
//     died. The others keep running (troupe train recovers in place); the coordinator
//     (host:port), secret and launch id stay the same. Not after the launcher received
//     SIGINT/SIGTERM/SIGUSR1, nor once a process failed (the grace period), nor past 100
//     respawns (one line says the launcher gives up): then the loss is a failure like any other.
//   --respawn job: when a process exits 75 (and no signal was forwarded), the others get
//     the grace period, then all N start again with TROUPE_RESTART_COUNT = k (the
//     job's k-th start again), TROUPE_FAILURE_TIME = when the previous start's first process
//     failed, and a new free port unless --coordinator was given, after the job's back-off;
//     at most 100 times (then one line says the launcher gives up).
#pragma once

namespace troupe {

// Runs `troupe launch`. argv[0] .. argv[argc-1] are the arguments AFTER the word "launch"
// (main passes argc - 2, argv + 2). Reports its own errors, never throws:
//   bad input (missing / non-numeric / out of range --nprocs (1..1024), a malformed
//   --coordinator, a negative or non-numeric --grace or --respawn-backoff, a --respawn other than process or
//   job, an unknown option, no "--" or no command after it): one line "error: ... <the
//   fix>" on stderr, returns 2, starts nothing;
//   the launcher itself failing (no free port, no randomness, fork fails): "error: ...",
//   the children already started are killed, returns 1.
// Otherwise returns once every child has been reaped (a lost child started again does not
// count as failed):
//   0 when every child exited 0;
//   else the status of the FIRST child that failed: its exit code, or 128 + the signal
//   number when a signal killed it (SIGKILL → 137); 127 when COMMAND cannot be executed.
// After the first failure the others get --grace seconds (default 35) to exit on their own;
// then the launcher SIGKILLs them. A first failure with exit 2 (a refusal, or a process
// stopped alone while the job assembles) gets them SIGTERM after 2 s, with a note naming the
// cause. A start prints one "error:" line, the first process's (core/job_error.h). SIGINT, SIGTERM and SIGUSR1 sent to the launcher are
// forwarded to every live child (except those the terminal sends to the whole foreground
// process group, which the children receive themselves). Children die with the launcher
// (PR_SET_PDEATHSIG = SIGKILL). `--help` prints the usage on stdout and returns 0.
int launch_main(int argc, char** argv);

}  // namespace troupe
