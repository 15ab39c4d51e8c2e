// `unet train --gpus N`: the launcher for one node. Starts N copies of this process's command line
// (without --gpus) as ranks 0..N-1 with torchrun's variables set (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT), then waits for them:
//  * SIGINT/SIGTERM/SIGHUP are forwarded to the ranks (which save and stop at the same step);
//    a second one kills them;
//  * when a rank fails, the others stop by themselves (their watchdog, control.h); any still
//    running after the grace period are killed;
//  * the ranks die with the launcher (PR_SET_PDEATHSIG).
// Returns the exit status for the launcher: 0 when every rank succeeded, else the first failing
// rank's (128 + signal for a signal).
#pragma once
#include <string>
#include <vector>

namespace unet {

int run_local_ranks(int n, double grace_s);

// argv without "--gpus N" / "--gpus=N" (exposed for tests).
std::vector<std::string> drop_gpus_flag(const std::vector<std::string>& argv);

}  // namespace unet
