#include "core/wire_check.hpp"

#include <capnp/dynamic.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

namespace caf_serving::wire_format {

namespace {

void walk(capnp::DynamicValue::Reader value);

void walk_struct(capnp::DynamicStruct::Reader s) {
  // Fields of an inactive union member are not read by anyone: has() is false.
  for (auto field : s.getSchema().getFields())
    if (s.has(field))
      walk(s.get(field));
}

void walk(capnp::DynamicValue::Reader value) {
  switch (value.getType()) {
    case capnp::DynamicValue::STRUCT:
      walk_struct(value.as<capnp::DynamicStruct>());
      break;
    case capnp::DynamicValue::LIST: {
      auto list = value.as<capnp::DynamicList>();
      switch (list.getSchema().whichElementType()) {
        case capnp::schema::Type::TEXT:
        case capnp::schema::Type::DATA:
        case capnp::schema::Type::LIST:
        case capnp::schema::Type::STRUCT:
          for (auto element : list)
            walk(element);
          break;
        default:
          break; // the list's bounds were checked when it was read
      }
      break;
    }
    default:
      break; // text and data are bounds-checked when they are read
  }
}

} // namespace

std::string unreadable_reason(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments,
                              capnp::StructSchema schema) {
  uint64_t words = 0;
  for (auto s : segments)
    words += s.size();
  capnp::ReaderOptions options;
  options.traversalLimitInWords = words + (uint64_t{1} << 17);
  capnp::SegmentArrayMessageReader reader(segments, options);
  KJ_IF_MAYBE (e, kj::runCatchingExceptions(
                    [&] { walk_struct(reader.getRoot<capnp::DynamicStruct>(schema)); })) {
    return std::string{e->getDescription().cStr()};
  }
  return {};
}

} // namespace caf_serving::wire_format
