#pragma once
/// Checks a Cap'n Proto message that arrived from another node before anything
/// reads it: its readers trust what they read and have no try block, so a
/// malformed message (a pointer out of its segment, a list where text belongs)
/// is refused where it is deserialized instead of throwing in an executor.

#include <capnp/message.h>
#include <capnp/schema.h>
#include <kj/array.h>

#include <string>

namespace caf_serving::wire_format {

/// Follows every pointer of the root in `segments` as `schema` says (texts,
/// data, lists, nested structs and groups), without reading tensor bytes, on a
/// reader of its own. Returns what is wrong, or an empty string when every
/// receiver can read the message.
///
/// One full reading may cost at most the message's size plus 1 MiB of Cap'n
/// Proto's traversal limit: a message of a few words can claim a list of a
/// million empty structs, and the receivers' reader allows 8 readings' worth of
/// its size (pipeline_messages.hpp), which such a message would exhaust midway.
std::string unreadable_reason(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments,
                              capnp::StructSchema schema);

} // namespace caf_serving::wire_format
