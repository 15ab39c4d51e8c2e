// unet init — placeholder until implemented.
#include "commands.h"
#include "util.h"

namespace unet {
void register_init(CLI::App& app) {
  auto* sub = app.add_subcommand("init", "(not implemented yet)");
  sub->callback([] { throw UserError("init: not implemented yet"); });
}
}  // namespace unet
