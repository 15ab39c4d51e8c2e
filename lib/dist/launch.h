// Who am I in a data-parallel run: rank, world size, local rank and where rank 0 listens, read
// from the environment of whichever launcher started this process:
//
//   torchrun --nproc-per-node N --no-python unet train ...   RANK WORLD_SIZE LOCAL_RANK
//                                                           LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
//   mpirun -np N unet train ...                             OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,
//                                                           LOCAL_SIZE}; MASTER_ADDR optional
//   srun unet train ...                                     SLURM_PROCID SLURM_STEP_NUM_TASKS (or
//                                                           SLURM_NTASKS) SLURM_LOCALID
//                                                           SLURM_STEP_TASKS_PER_NODE SLURM_NODEID,
//                                                           master = first host of the node list
//   unet train --gpus N ...                                 sets torchrun's variables for its children
//
// Precedence: torchrun's variables, then Open MPI's, then Slurm's (a torchrun inside srun, or an
// mpirun inside an allocation, is the inner launcher). Nothing set: one process, as without any
// launcher. Inconsistent values are a UserError naming the variable.
//
// Rank 0 listens at MASTER_ADDR:MASTER_PORT+1 (torchrun's own store holds MASTER_PORT); without
// MASTER_PORT (mpirun, srun) the port is derived from the job's id.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace unet {

struct DistEnv {
  int rank = 0, world = 1;
  int local_rank = 0, local_world = 1;
  std::string launcher = "none";  // "torchrun", "mpirun", "srun", "unet --gpus", "none"
  std::string master_addr;        // empty when unknown (multi-node mpirun without MASTER_ADDR)
  int port = 0;                   // where rank 0 listens (MASTER_PORT + 1)
  bool distributed() const { return world > 1; }
};

// getenv by default; tests pass a map.
using EnvLookup = std::function<const char*(const char*)>;
DistEnv parse_dist_env(const EnvLookup& env);
DistEnv parse_dist_env();

// Slurm's compressed host list: "gpu[01-04,07],login1" -> gpu01 gpu02 gpu03 gpu04 gpu07 login1.
// `var` names the variable in errors.
std::vector<std::string> expand_hostlist(const std::string& s, const std::string& var);
// Slurm's tasks per node: "2(x3),1" -> 2 2 2 1.
std::vector<int> expand_tasks_per_node(const std::string& s, const std::string& var);

// The GPU a rank uses: its local rank, or 0 when it sees one GPU only (CUDA_VISIBLE_DEVICES set
// per rank by the launcher). UserError when the node has too few GPUs for its ranks.
int gpu_for_rank(const DistEnv& e, int visible_gpus);

}  // namespace unet
