// How many operators the dispatcher has deregistered, for the recorder's caches of what it knows
// of an operator, which key it by its schema's address.
#pragma once

#include <cstdint>

namespace torchdefer::detail {

// Note [Operators known by their schema's address]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The recorder asks the same questions of an operator on every recorded call (does it draw, may
// it read values, which arguments does it write, where is its generator argument), so it keeps
// the answers per operator and thread, keyed by the address of the operator's schema, which lives
// as long as its registration. The address can describe another operator only after the first
// was deregistered, and the dispatcher tells its registration listeners of every deregistration
// before it removes the schema (c10::Dispatcher::deregisterDef_). So a listener counts
// deregistrations, and a cache forgets what it learnt before the count moved: one atomic load per
// call instead of comparing the operator's name and overload name (a quarter of a lookup's cost,
// and blind to a schema redefined at the same address under the same name).
uint64_t deregistrations_so_far();

}  // namespace torchdefer::detail
