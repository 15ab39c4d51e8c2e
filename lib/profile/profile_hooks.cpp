#include "profile_hooks.h"

namespace unet {
namespace {
RangeListener* g_listener = nullptr;
}
RangeListener* range_listener() { return g_listener; }
void set_range_listener(RangeListener* l) { g_listener = l; }
}  // namespace unet
