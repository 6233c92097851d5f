// cli/train_signals.h — the stop signals of `troupe train`: a request to snapshot the step
// under way and stop, a second one that ends the run at once, and the CPU-time limit.
#pragma once
#include <atomic>

namespace troupe::cli {

// The stop signal that came (0: none yet); the job reads it (JobContext::stop_signal).
std::atomic<int>& train_stop_signal();
// Installs the handlers (core/interrupt.h's stop signals, except those inherited as ignored):
// from here a stop signal is a request (train_stop_signal()), not the early exit of
// cli/main.cpp. SIGXCPU (the soft CPU-time limit) is one too when the hard limit is
// unlimited or at least 60 CPU seconds above it; otherwise it ends the run at once, naming
// the steps lost and the newest snapshot (exit 2).
void install_stop_signals();

}  // namespace troupe::cli
