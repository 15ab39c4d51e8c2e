// unet prepare — placeholder until implemented.
#include "commands.h"
#include "util.h"

namespace unet {
void register_prepare(CLI::App& app) {
  auto* sub = app.add_subcommand("prepare", "(not implemented yet)");
  sub->callback([] { throw UserError("prepare: not implemented yet"); });
}
}  // namespace unet
