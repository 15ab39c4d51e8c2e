// unet profile — placeholder until implemented.
#include "commands.h"
#include "util.h"

namespace unet {
void register_profile(CLI::App& app) {
  auto* sub = app.add_subcommand("profile", "(not implemented yet)");
  sub->callback([] { throw UserError("profile: not implemented yet"); });
}
}  // namespace unet
