// unet train DATA.h5 — thin: parse flags, pick the starting checkpoint, call lib/trainer. The same
// code runs `unet train-classifier` (train_classifier.cpp registers its flags).
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <regex>
#include <set>
#include <thread>

#include "checkpoint.h"
#include "classifier_free.h"
#include "classifier_train.h"
#include "comm.h"
#include "commands.h"
#include "env_vars.h"
#include "init.h"
#include "params.h"
#include "preflight.h"
#include "resume.h"
#include "spawn.h"
#include "train_args.h"
#include "trainer.h"
#include "util.h"

namespace unet {
namespace {
// Flags whose explicit use on --resume overrides the checkpoint's setting (resume.h); those a
// command does not have are skipped.
const char* const kSettingFlags[] = {"--batch-size",   "--seed",
                                     "--lr",           "--lr-warmup",
                                     "--ema-rate",     "--grad-clip",
                                     "--weight-decay", "--no-flip",
                                     "--steps",        "--save-every",
                                     "--log-every",    "--sample-every",
                                     "--microbatch",   "--schedule-sampler",
                                     "--lr-anneal-steps",
                                     "--noised",       "--eval-every"};

void on_signal(int) { stop_requested().store(true); }

std::string default_rundir() {
  std::time_t t = std::time(nullptr);
  char b[64];
  std::strftime(b, sizeof b, "runs/%Y%m%d-%H%M%S", std::localtime(&t));
  return b;
}

// Names the trainer writes inside the run directory.
bool is_run_output(const std::string& name) {
  static const std::regex re(R"((latest\.h5|metrics\.csv|\.lock|ckpt_[0-9]+\.h5|samples_[0-9]+\.png))");
  return std::regex_match(name, re);
}

// An input that lives in the run directory under an output's name would be overwritten.
void check_input_not_in_outputs(const std::string& rundir, const std::string& in, const std::string& what) {
  namespace fs = std::filesystem;
  if (in.empty()) return;
  const std::string name = fs::path(in).filename().string();
  if (is_run_output(name) && same_file(in, rundir + "/" + name))
    throw UserError(in + ": the " + what + " is inside the run directory " + rundir +
                    " under a name the run writes; refusing to overwrite an input (choose another -o)");
}

// --gpus N starts N ranks on this machine: one per visible GPU, or with --device cpu at most one
// per core (as mpirun without --oversubscribe).
void check_local_ranks(int n, const std::string& device) {
  const std::string flag = "--gpus " + std::to_string(n);
  if (device == "cpu") {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    if ((unsigned)n > cores)
      throw UserError(flag + " --device cpu: " + std::to_string(n) + " CPU ranks but this machine has " +
                      std::to_string(cores) + " cores (at most one rank per core)");
    return;
  }
  const int gpus = cuda_device_count();
  if (gpus == 0)
    throw UserError(flag + ": no GPU is visible" +
                    (device.empty() ? " (--device cpu starts CPU ranks instead)" : std::string()));
  if (n > gpus)
    throw UserError(flag + ": only " + std::to_string(gpus) + " GPU" + (gpus > 1 ? "s are" : " is") +
                    " visible (one rank per GPU)");
}

// A run directory this run created: removed again if the run ends before writing anything there
// but its lock file (refused after the directory was made: a forced kernel variant, too little
// memory for the batch, ...), so that a refused run leaves nothing behind.
class NewDirCleanup {
 public:
  explicit NewDirCleanup(std::string dir) : dir_(std::move(dir)) {}
  ~NewDirCleanup() {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().filename() != ".lock") return;  // the run wrote something: keep it all
    fs::remove(dir_ + "/.lock", ec);
    fs::remove(dir_, ec);  // only when empty
  }
  NewDirCleanup(const NewDirCleanup&) = delete;
  NewDirCleanup& operator=(const NewDirCleanup&) = delete;

 private:
  std::string dir_;
};

// "rank 0 gpu01 GPU 0, rank 1 gpu01 GPU 1": where each rank runs (from all_gather), and checks
// that every rank chose the same kind of engine.
std::string describe_ranks(const std::vector<std::string>& all, int* nodes) {
  std::set<std::string> hosts;
  std::string out, kind0;
  for (size_t r = 0; r < all.size(); ++r) {
    const size_t t1 = all[r].find('\t'), t2 = all[r].find('\t', t1 + 1);
    const std::string host = all[r].substr(0, t1), where = all[r].substr(t1 + 1, t2 - t1 - 1),
                      kind = all[r].substr(t2 + 1);
    if (r == 0) kind0 = kind;
    if (kind != kind0)
      throw UserError("rank " + std::to_string(r) + " runs on " + kind + " but rank 0 on " + kind0 +
                      " (give every rank the same --device, and a GPU to each)");
    hosts.insert(host);
    if (r < 16) out += std::string(r ? ", " : "") + "rank " + std::to_string(r) + " " + host + " " + where;
  }
  if (all.size() > 16) out += ", ...";
  *nodes = (int)hosts.size();
  return out;
}

}  // namespace

CLI::Validator setting_check(const char* flag) {
  const SettingRange r = train_setting_range(flag);
  return r.integer ? int_range(r.ilo, r.ihi) : real_range(r.lo, r.hi, r.lo_open);
}

void run_train(TrainArgs& a) {
  namespace fs = std::filesystem;
  TrainOptions o = a.opt;
  o.flip = !a.no_flip;
  const bool cls = a.classifier;
  const char* const cmd = cls ? "unet train-classifier" : "unet train";
  const std::string net = cls ? "classifier" : "model";

  // Data-parallel: this process is a rank started by a launcher (torchrun, mpirun, srun, --gpus),
  // or the --gpus launcher itself, or a single process (no launcher).
  DistEnv env = parse_dist_env();
  const bool launcher = a.gpus > 1;
  if (a.gpus > 0 && env.distributed())
    throw UserError("--gpus: this process is already rank " + std::to_string(env.rank) + " of " +
                    std::to_string(env.world) + " (started by " + env.launcher +
                    "); use either --gpus or a launcher");
  const int world = launcher ? a.gpus : env.world;
  const bool root = env.rank == 0;
  if (env.distributed() && !root) error_prefix() = "rank " + std::to_string(env.rank) + ": ";
  // Connected first, so that a rank failing a check below stops the others at once.
  std::unique_ptr<ControlPlane> cp = connect_control_plane(env, a.dist_timeout);
  if (!a.init.empty() && !a.resume.empty()) throw UserError("--init and --resume are exclusive");
  a.resume = checkpoint_arg(a.resume, "--resume");
  a.init = checkpoint_arg(a.init, "--init");
  if ((!a.init.empty() || !a.resume.empty()) && (cls ? a.cmodel.any_given() : a.model.any_given()))
    throw UserError(cls ? a.cmodel.given_names() +
                              ": classifier flags cannot be combined with --init/--resume: the classifier "
                              "comes from the checkpoint"
                        : a.model.given_names() +
                              ": model flags cannot be combined with --init/--resume: the model and its "
                              "training objective come from the checkpoint");
  check_input_exists(a.data);
  if (cls && !o.val_data.empty()) check_input_exists(o.val_data);
  check_environment({{"dataset", a.data},
                     {"--val-data dataset", o.val_data},
                     {"--init checkpoint", a.init},
                     {"--resume checkpoint", a.resume}});
  auto load = [&](const std::string& path, bool opt) {
    return cls ? load_classifier_checkpoint(path, opt) : load_checkpoint(path, opt);
  };

  Checkpoint ck;
  std::vector<std::string> warnings;
  const bool resume = !a.resume.empty();
  std::string model_src = "the " + net + " flags";
  if (resume) {
    ck = load(a.resume, /*need_optimizer=*/true);
    if (!ck.state.count("step"))
      throw UserError(a.resume + ": no training state (state/step); use --init to start from it");
    std::set<std::string> given;
    for (const char* f : kSettingFlags)
      if (CLI::Option* opt = a.app->get_option_no_throw(f); opt && opt->count()) given.insert(f);
    if (a.class_dropout_opt && a.class_dropout_opt->count())
      given.insert("--class-dropout");  // so is the class dropout
    ResumeSettings rs = resolve_resume(ck, a.resume, o, given);
    o = rs.opt;
    warnings = rs.warnings;
    if (a.rundir.empty()) a.rundir = fs::path(a.resume).parent_path().string();
    if (a.rundir.empty()) a.rundir = ".";
    if (given.count("--steps") && o.steps <= ck.state.at("step"))
      throw UserError("--steps " + std::to_string(o.steps) + " is not past the checkpoint's step " +
                      std::to_string(ck.state.at("step")) + " (--steps counts from the start of training)");
    model_src = a.resume;
  } else if (!a.init.empty()) {
    ck = load(a.init, false);
    if (!ck.ema.empty()) ck.ema.clear();  // a fresh run's EMA starts from the weights it trains
    model_src = a.init;
  } else if (cls) {
    ck.is_classifier = true;
    ck.ccfg = a.cmodel.resolve();
  } else {
    ck.cfg = a.model.resolve();
  }
  // guided-diffusion stops at lr_anneal_steps, where the learning rate reaches 0: the run's default
  // end; a --steps past it is refused.
  if (o.lr_anneal_steps > 0) {
    const int64_t at = resume ? ck.state.at("step") : 0;
    if (o.steps == 0) o.steps = o.lr_anneal_steps;
    if (o.steps > o.lr_anneal_steps)
      throw UserError((a.app->get_option("--steps")->count() ? "--steps " : a.resume + "'s --steps target ") +
                      std::to_string(o.steps) + " goes past --lr-anneal-steps " +
                      std::to_string(o.lr_anneal_steps) + ": the learning rate is 0 from there");
    if (o.steps <= at)
      throw UserError(a.resume + " is at step " + std::to_string(at) + ", which --lr-anneal-steps " +
                      std::to_string(o.lr_anneal_steps) + " ends the run at; give a larger one to train on");
  }
  // Classifier-free guidance: the class dropout is the flag's, else the checkpoint's class_dropout
  // (on --resume resolve_resume has taken it). It needs the null class's row of label_emb: a fresh
  // model gets one, an --init checkpoint without one gains it, a resumed run cannot.
  bool added_null_class = false;
  if (!cls) {
    const bool cd_given = a.class_dropout_opt->count() > 0;
    if (cd_given && !(a.opt.class_dropout < 1))
      throw UserError(
          "--class-dropout must be in [0, 1), not 1"
          " (every label dropped leaves nothing conditional to learn)");
    if (!resume) o.class_dropout = cd_given ? a.opt.class_dropout : ck.cfg.class_dropout;
    if ((cd_given || o.class_dropout > 0) && !ck.cfg.class_cond) {
      const std::string what = resume ? a.resume : !a.init.empty() ? a.init : "";
      throw UserError("--class-dropout needs a class-conditional model (" +
                      (what.empty() ? std::string("--class-cond") : what + " is not class-conditional") +
                      ")");
    }
    if (o.class_dropout > 0 && !ck.cfg.null_class) {
      if (resume)
        throw UserError("--class-dropout: " + a.resume +
                        " has no null class, and a run cannot gain one on --resume (start a new run from it "
                        "with --init, which adds one)");
      if (a.init.empty()) {
        ck.cfg.null_class = true;
      } else {
        add_null_class(ck, o.seed);
        added_null_class = true;
      }
    }
    if (!resume) ck.cfg.class_dropout = o.class_dropout;
  }
  const ParamTable t = ck.table();
  if (o.batch_size % world != 0)
    throw UserError((resume && !a.app->get_option("--batch-size")->count() ? "the checkpoint's batch size "
                                                                           : "--batch-size ") +
                    std::to_string(o.batch_size) + " is not divisible by the " + std::to_string(world) +
                    " ranks (the batch size is global: each rank takes an equal slice)");
  // Micro-batches of N samples: N divides each rank's batch, or is at least that batch (whole).
  if (o.microbatch > 0 && o.microbatch < o.batch_size / world && (o.batch_size / world) % o.microbatch != 0)
    throw UserError((resume && !a.app->get_option("--microbatch")->count() ? "the checkpoint's microbatch "
                                                                           : "--microbatch ") +
                    std::to_string(o.microbatch) + " does not divide the batch" +
                    (world > 1 ? " of each rank (" : " (--batch-size ") +
                    std::to_string(o.batch_size / world) + ")");
  if (launcher) check_local_ranks(a.gpus, a.dev.device);
  if (a.rundir.empty()) a.rundir = default_rundir();
  if (cp) a.rundir = cp->broadcast(a.rundir);  // rank 0's (the default name has the time in it)
  o.rundir = a.rundir;

  // Outputs: a directory that is not an input nor holds one under an output's name.
  std::error_code ec;
  struct stat rst;  // (missing: made below; under a file: "cannot create the run directory" below)
  if (::stat(o.rundir.c_str(), &rst) == 0) {
    if (!S_ISDIR(rst.st_mode))
      throw UserError(o.rundir + ": exists and is not a directory (-o names the run directory)");
  } else if (errno != ENOENT && errno != ENOTDIR) {
    throw UserError(o.rundir + ": cannot use as the run directory (" + errno_text(errno) + ")");
  }
  check_input_not_in_outputs(o.rundir, a.data, "dataset");
  check_input_not_in_outputs(o.rundir, o.val_data, "--val-data dataset");
  check_input_not_in_outputs(o.rundir, a.init, "--init checkpoint");
  for (const char* name : {"/metrics.csv", "/latest.h5"}) {  // also through links planted there
    check_not_input(o.rundir + name, a.data, "dataset");
    check_not_input(o.rundir + name, o.val_data, "--val-data dataset");
    check_not_input(o.rundir + name, a.init, "--init checkpoint");
    if (std::string(name) != "/latest.h5") check_not_input(o.rundir + name, a.resume, "--resume checkpoint");
  }
  // A new run never writes over another: checked now, and again under the directory's lock.
  auto refuse_other_run = [&] {
    if (!resume && fs::exists(o.rundir + "/latest.h5", ec))
      throw UserError(o.rundir + ": already holds a run (latest.h5); continue it with --resume " + o.rundir +
                      " or choose another -o");
  };
  refuse_other_run();

  // The dataset against the model (and, on resume, against the run's), then host memory.
  TrainData data =
      cls ? check_train_data(a.data, ck.ccfg, model_src) : check_train_data(a.data, ck.cfg, model_src);
  if (cls && !o.val_data.empty()) check_train_data(o.val_data, ck.ccfg, model_src);
  if (resume) check_resume_dataset(ck, a.resume, a.data, data.info, data.fingerprint);
  o.dataset_fingerprint = data.fingerprint;
  const int ckpt_arenas = 1 + (ck.ema.empty() ? 0 : 1) + (ck.has_optimizer ? 2 : 0);
  // The --gpus launcher's ranks all run on this machine: each needs its own.
  check_memory(train_host_bytes(t, ckpt_arenas, o.batch_size / world, data.info) * (launcher ? a.gpus : 1),
               "training (batch " + std::to_string(o.batch_size) + ", " + std::to_string(t.count / 1000000) +
                   " M parameters, " + std::to_string(data.info.count) + " images" +
                   (launcher ? ", " + std::to_string(a.gpus) + " ranks" : std::string()) + ")");
  if (!resume && a.init.empty()) {
    check_model_size(t, 1, "the " + net + " flags");
    if (!launcher) ck.model = init_params(t, o.seed);  // the ranks make their own
  }

  // --gpus N: everything checked once here; the N ranks check again and train.
  if (launcher) {
    const int code = run_local_ranks(a.gpus, a.dist_timeout + 15);
    if (code != 0) throw SilentError();  // the ranks said why
    return;
  }

  // The device (a rank's GPU is its local rank) and its engine, which refuses a forced kernel
  // variant it lacks (UNET_KERNELS, --kernels): before anything is written.
  int gpu = -1;
  if (env.distributed() && a.dev.device != "cpu") {
    const int n = cuda_device_count();
    if (n > 0) cuda_set_device(gpu = gpu_for_rank(env, n));
  }
  if (env.distributed() && !std::getenv("OMP_NUM_THREADS"))  // CPU ranks of one node share its cores
    omp_set_num_threads((int)std::max(1u, std::thread::hardware_concurrency() / (unsigned)env.local_world));
  std::string device;
  auto eng = a.dev.make(&device);

  // The run directory: checked writable, created, locked against a second trainer (by rank 0,
  // which alone writes there). One this run created is removed again when the run fails before
  // writing anything into it (a refused run leaves nothing behind).
  std::unique_ptr<DirLock> lock;
  std::unique_ptr<NewDirCleanup> cleanup;
  if (root) {
    if (fs::is_directory(o.rundir, ec)) {
      check_writable_dir_for(o.rundir + "/metrics.csv");
      check_writable_dir_for(o.rundir + "/latest.h5");
    }
    const bool existed = fs::exists(o.rundir, ec);
    fs::create_directories(o.rundir, ec);
    if (!fs::is_directory(o.rundir, ec)) throw UserError(o.rundir + ": cannot create the run directory");
    if (!existed) cleanup = std::make_unique<NewDirCleanup>(o.rundir);
    lock = std::make_unique<DirLock>(o.rundir, cmd);
    refuse_other_run();  // (latest.h5 written by a trainer that just finished)
    check_writable_dir_for(o.rundir + "/metrics.csv");
    check_writable_dir_for(o.rundir + "/latest.h5");
    remove_stale_temps(o.rundir);
  }

  // Everything checked: the communicator, and the only informational output, on stdout.
  CommOptions co;
  co.timeout_s = a.dist_timeout;
  co.bucket_bytes = env_bucket_bytes(co.bucket_bytes);  // UNET_BUCKET_MB
  std::unique_ptr<Communicator> comm = make_communicator(env, std::move(cp), *eng, co);
  std::string ranks_line;
  if (env.distributed()) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    const std::string where = eng->is_cuda() ? "GPU " + std::to_string(std::max(gpu, 0)) : std::string("cpu");
    int nodes = 1;
    const std::string ranks =
        describe_ranks(comm->all_gather(std::string(host) + "\t" + where + "\t" + eng->name()), &nodes);
    ranks_line = "distributed: " + std::to_string(env.world) + " ranks, " + std::to_string(env.local_world) +
                 " per node on " + std::to_string(nodes) + " node" + (nodes > 1 ? "s" : "") +
                 ", started by " + env.launcher + ", " + comm->backend() + " (" + ranks + ")";
  }
  const int64_t start_step = resume ? ck.state.at("step") : 0;
  // Printed once the trainer has planned its memory: every check came first.
  auto started = [&] {
    if (!root) return;
    for (const std::string& w : warnings) std::fprintf(stderr, "unet: warning: %s\n", one_line(w).c_str());
    if (!ranks_line.empty()) std::printf("%s\n", ranks_line.c_str());
    if (added_null_class)
      std::printf(
          "unet train: %s has no null class: label_emb gains row %d (N(0,1), --seed %llu) for "
          "--class-dropout\n",
          a.init.c_str(), ck.cfg.num_classes, (unsigned long long)o.seed);
    std::printf("%s: %.2f M parameters, batch %d%s, %s, %s step %lld%s -> %s\n", cmd, t.count / 1e6,
                o.batch_size,
                env.distributed() ? (" (" + std::to_string(o.batch_size / world) + " per rank)").c_str() : "",
                device.c_str(), resume ? "resuming at" : "starting at", (long long)start_step,
                o.steps ? (" until step " + std::to_string(o.steps)).c_str() : " (until interrupted)",
                o.rundir.c_str());
    std::fflush(stdout);
  };
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  TrainResult r;
  if (cls) {
    ClassifierTask task(ck.ccfg, o);
    r = run_training(*eng, a.data, std::move(ck), resume, o, comm.get(), task, started);
  } else {
    r = train(*eng, a.data, std::move(ck), resume, o, comm.get(), started);
  }
  // The step's graph holds the captured NCCL calls: gone before the communicator (it is destroyed
  // first, as it was made from the engine), or ncclCommDestroy waits for it forever.
  eng->device().graph_drop();
  comm->finish();  // every rank is done: none takes another's exit for a failure
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (!root) {
    if (r.diverged) throw SilentError();  // rank 0 reports it
    return;
  }
  if (r.diverged) {
    const std::string good = !r.last_checkpoint.empty() ? r.last_checkpoint
                             : resume                   ? a.resume + " (resumed from)"
                                                        : "none (no checkpoint was saved)";
    // At the run's first step the weights it started from are the suspects (a damaged --init
    // checkpoint can hold finite but absurd values): named. (A new run directory is left empty
    // then, metrics.csv being made with its first row, and NewDirCleanup removes it.)
    const std::string from =
        r.step == start_step + 1 && !a.init.empty() ? " (the first step from " + a.init + "'s weights)" : "";
    throw UserError(r.stop_reason + from + "; training stopped. Last good checkpoint: " + good);
  }
  if (r.interrupted)
    std::printf("interrupted at step %lld", (long long)r.step);
  else
    std::printf("finished at step %lld", (long long)r.step);
  if (!r.last_checkpoint.empty())
    std::printf("; checkpoint %s (also %s/latest.h5)", r.last_checkpoint.c_str(), o.rundir.c_str());
  std::printf("\n");
  if (r.labels_seen > 0)
    std::printf(
        "class dropout: %lld of %lld labels (%.2f%%) replaced by the null class (--class-dropout %g)\n",
        (long long)r.labels_dropped, (long long)r.labels_seen, 100.0 * r.labels_dropped / r.labels_seen,
        o.class_dropout);
  std::printf("peak %s memory %.2f GB (planned buffers and workspaces%s)\n", eng->is_cuda() ? "GPU" : "host",
              eng->device().bytes_held() / 1e9, eng->is_cuda() ? "; the CUDA context not counted" : "");
}
void add_train_flags(CLI::App* sub, TrainArgs* a) {
  a->app = sub;
  const bool cls = a->classifier;
  sub->add_option("data", a->data,
                  cls ? "labelled dataset (HDF5 from unet prepare --labels subdirs)"
                      : "dataset (HDF5 from unet prepare)")
      ->required();
  sub->add_option("--init", a->init,
                  "start from this checkpoint's weights (fresh optimizer); a run directory: its latest.h5");
  sub->add_option(
      "--resume", a->resume,
      "continue this checkpoint's run exactly (weights, EMA, optimizer, data order, RNG, settings); a run "
      "directory: its latest.h5");
  sub->add_option("-o,--output", a->rundir,
                  "run directory (default runs/<date>-<time>, or the --resume checkpoint's directory)");
  auto& o = a->opt;
  auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  sub->add_option("--batch-size", o.batch_size,
                  "images per step (default " + std::to_string(o.batch_size) + ")")
      ->check(setting_check("--batch-size"));
  sub->add_option("--lr", o.lr, "AdamW learning rate (default " + num(o.lr) + ")")
      ->check(setting_check("--lr"));
  sub->add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (default 0)")
      ->check(setting_check("--weight-decay"));
  sub->add_option(
         "--ema-rate", o.ema_rate,
         cls ? "keep an EMA of the weights with this decay (default 0 = none, as classifier_train.py)"
             : "EMA decay of the weights (default 0.9999)")
      ->check(setting_check("--ema-rate"));
  sub->add_option("--steps", o.steps,
                  "stop at this global step, counting steps before a resume (default: until Ctrl-C)")
      ->check(setting_check("--steps"));
  sub->add_option("--save-every", o.save_every,
                  "checkpoint every N steps (default 10000; 0 = only at the end; always at the end)")
      ->check(setting_check("--save-every"));
  sub->add_option("--log-every", o.log_every,
                  "log loss/grad norm/speed every N steps (default 10; 0 = at the end)")
      ->check(setting_check("--log-every"));
  if (!cls)
    sub->add_option("--sample-every", o.sample_every,
                    "write a sample grid (EMA, DDIM 50) every N steps (default 0 = never)")
        ->check(setting_check("--sample-every"));
  sub->add_option("--grad-clip", o.grad_clip, "clip the global gradient norm to X (default 0 = off)")
      ->check(setting_check("--grad-clip"));
  sub->add_option("--lr-warmup", o.lr_warmup, "linear learning-rate warmup over N steps (default 0)")
      ->check(setting_check("--lr-warmup"));
  sub->add_option("--lr-anneal-steps", o.lr_anneal_steps,
                  "guided-diffusion's lr_anneal_steps: the learning rate decays linearly to 0 over N steps "
                  "(lr (1 - step / N)), and the run stops at step N unless --steps stops it sooner (default "
                  "0 = constant)")
      ->check(setting_check("--lr-anneal-steps"));
  sub->add_option(
         "--microbatch", o.microbatch,
         "accumulate gradients over micro-batches of N samples (must divide each rank's batch; N at least "
         "the batch = the whole batch; the " +
             std::string(cls ? "classifier" : "model") +
             " is planned for N: less memory, same result up to summation order; default 0 = whole batch)")
      ->check(setting_check("--microbatch"));
  if (!cls)
    sub->add_option(
           "--schedule-sampler", o.schedule_sampler,
           "timestep sampler: uniform (default) or loss-second-moment (guided-diffusion's importance "
           "sampling; reads each step's losses back)")
        ->check(CLI::IsMember({"uniform", "loss-second-moment"}));
  sub->add_flag("--no-flip", a->no_flip,
                "disable random horizontal flips (--no-flip=false turns them back on)");
  sub->add_option(
         "--seed", o.seed,
         "seed of data order, noise, timesteps, flips, dropout and fresh init, 0 to 2^63-1 (default 0)")
      ->check(setting_check("--seed"));
  sub->add_option("--gpus", a->gpus,
                  "train on N GPUs of this machine: starts N processes, one per GPU (data-parallel; "
                  "--batch-size is the global batch). torchrun, mpirun and srun work too")
      ->check(int_range(1, 1024));
  sub->add_option("--dist-timeout", a->dist_timeout,
                  "seconds after which a rank that died or hangs stops every rank of the run (default 60)")
      ->check(real_range(1, 86400));
  a->dev.add(sub);
}

void register_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto* sub = app.add_subcommand("train", "train a model on a dataset made by `unet prepare`");
  sub->footer(
      "--resume takes every training setting from the checkpoint: batch size, seed, lr and warmup,\n"
      "EMA rate, grad clip, weight decay, flips, schedule sampler, class dropout, the save/log/sample\n"
      "intervals and the --steps target; a flag given explicitly overrides one (with a warning when that\n"
      "changes the continuation). It also checks that DATA is the dataset the run was trained on.");
  add_train_flags(sub, a.get());
  a->class_dropout_opt =
      sub->add_option(
             "--class-dropout", a->opt.class_dropout,
             "classifier-free guidance: replace each label by the null class with probability P, "
             "in [0, 1) (class-conditional models; adds the null class's label_emb row to a fresh or "
             "--init model that lacks one; default: the checkpoint's class_dropout, else 0)")
          ->check(real_range(0, 1));
  a->model.add(sub);
  sub->callback([a] { run_train(*a); });
}

}  // namespace unet
