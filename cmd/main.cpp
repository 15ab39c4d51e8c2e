// unet: git-style dispatcher. Subcommands live one per file in cmd/.
#include <csignal>
#include <cstdio>

#include "commands.h"
#include "util.h"

int main(int argc, char** argv) {
  // Past a file-size limit (ulimit -f) a write should fail with EFBIG and be reported like a full
  // disk, not kill the process (SIGXFSZ's default) and leave a temporary file behind.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"unet — train and sample guided-diffusion UNet models (C++/CUDA)", "unet"};
  app.set_version_flag("--version", std::string("unet ") + UNET_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  unet::register_prepare(app);
  unet::register_init(app);
  unet::register_train(app);
  unet::register_train_classifier(app);
  unet::register_sample(app);
  unet::register_profile(app);
  unet::register_eval(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help / --version
  } catch (const CLI::ValidationError& e) {
    std::fprintf(stderr, "unet: %s\n", unet::one_line(e.what()).c_str());  // names the flag and its range
    return 1;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "unet: %s (see 'unet --help')\n", unet::one_line(e.what()).c_str());
    return 1;
  } catch (const unet::SilentError&) {
    return 1;
  } catch (const unet::UserError& e) {
    std::fprintf(stderr, "unet: %s%s\n", unet::error_prefix().c_str(), unet::one_line(e.what()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unet: %sinternal error: %s\n", unet::error_prefix().c_str(),
                 unet::one_line(e.what()).c_str());
    return 2;
  }
  return 0;
}
