// unet train — placeholder until implemented.
#include "commands.h"
#include "util.h"

namespace unet {
void register_train(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "(not implemented yet)");
  sub->callback([] { throw UserError("train: not implemented yet"); });
}
}  // namespace unet
