// cli/launch.h — `troupe launch`: starts the processes of a job on this host (like
// torchrun's standalone mode) and waits for them. docs/launch.md is the user's guide.
//
//   troupe launch --nprocs N [--coordinator HOST:PORT] [--grace SECONDS] -- COMMAND [ARGS...]
//
// Each of the N children runs COMMAND (execvp, so COMMAND is looked up in PATH) with the
// launcher's environment plus the contract read by core/launch_env.h:
//   TROUPE_RANK=r, TROUPE_WORLD_SIZE=N, TROUPE_LOCAL_RANK=r   (r = 0 .. N-1)
//   TROUPE_COORDINATOR=HOST:PORT   (default 127.0.0.1 and a port free when the launcher
//                                   started; rank 0 listens there)
//   TROUPE_JOB_SECRET=<64 hex>     (32 random bytes from getrandom(2); an already set
//                                   TROUPE_JOB_SECRET is passed through unchanged)
#pragma once

namespace troupe {

// Runs `troupe launch`. argv[0] .. argv[argc-1] are the arguments AFTER the word "launch"
// (main passes argc - 2, argv + 2). Reports its own errors, never throws:
//   bad input (missing / non-numeric / out of range --nprocs (1..1024), a malformed
//   --coordinator, a negative or non-numeric --grace, an unknown option, no "--" or no
//   command after it): one line "error: ... <the fix>" on stderr, returns 2, starts nothing;
//   the launcher itself failing (no free port, no randomness, fork fails): "error: ...",
//   the children already started are killed, returns 1.
// Otherwise returns once every child has been reaped:
//   0 when every child exited 0;
//   else the status of the FIRST child that failed: its exit code, or 128 + the signal
//   number when a signal killed it (SIGKILL → 137); 127 when COMMAND cannot be executed.
// After the first failure the others get --grace seconds (default 35) to exit on their own;
// then the launcher SIGKILLs them. SIGINT, SIGTERM and SIGUSR1 sent to the launcher are
// forwarded to every live child (except those the terminal sends to the whole foreground
// process group, which the children receive themselves). Children die with the launcher
// (PR_SET_PDEATHSIG = SIGKILL). `--help` prints the usage on stdout and returns 0.
int launch_main(int argc, char** argv);

}  // namespace troupe
