// unet sample — placeholder until implemented.
#include "commands.h"
#include "util.h"

namespace unet {
void register_sample(CLI::App& app) {
  auto* sub = app.add_subcommand("sample", "(not implemented yet)");
  sub->callback([] { throw UserError("sample: not implemented yet"); });
}
}  // namespace unet
