#include "ingress/shm_tensors.hpp"

#include "core/datatype.hpp"
#include "ingress/validate.hpp"

#include <cstring>
#include <limits>

namespace caf_serving::ingress {

namespace {

std::string quoted(std::string_view s) {
  return "'" + std::string(s) + "'";
}

serving_error region_fault(std::string_view tensor, const shared_memory_ref& ref,
                           const char* direction) {
  return bad_request("the memory of shared memory region " + quoted(ref.region) + " faulted while "
                     + direction + " " + std::string(tensor)
                     + "; the client shrank the shared-memory object under the registered "
                       "region, or the system is out of shared memory. Register the region "
                       "again over an object of the right size");
}

} // namespace

result<shared_memory_binding> bind_shared_memory(infer_request& request,
                                                 const shared_memory_registry& registry,
                                                 const model_config& model) {
  shared_memory_binding binding;
  for (auto& input : request.inputs) {
    if (!input.shared_memory)
      continue;
    const auto& ref = *input.shared_memory;
    auto slice = registry.slice(ref.region, ref.offset, ref.byte_size);
    if (!slice)
      return slice.error();
    std::string what = "input " + quoted(input.name);
    if (input.dtype != datatype::bytes) {
      auto count = checked_element_count(input.shape, std::numeric_limits<uint64_t>::max(), what);
      if (!count)
        return count.error();
      uint64_t esize = element_size(input.dtype);
      if (*count > std::numeric_limits<uint64_t>::max() / esize)
        return bad_request(what + " has shape " + format_shape(input.shape)
                           + ", whose byte size overflows");
      uint64_t expected = *count * esize;
      if (expected != ref.byte_size)
        return bad_request("input byte size mismatch for input " + quoted(input.name)
                           + " for model " + quoted(model.name) + ". Expected "
                           + std::to_string(expected) + ", got " + std::to_string(ref.byte_size)
                           + "; shared_memory_byte_size must be the tensor's size, and shape "
                           + format_shape(input.shape) + " of "
                           + std::string(to_string(input.dtype)) + " is "
                           + std::to_string(expected) + " bytes");
      input.data = std::string_view(slice->data, slice->size);
    } else {
      input.owned.resize(slice->size);
      if (!copy_from_shared_memory(input.owned.data(), slice->data, slice->size))
        return region_fault(what, ref, "reading");
      input.data = input.owned;
    }
    binding.inputs_.push_back(std::move(*slice));
  }
  for (const auto& output : request.outputs) {
    if (!output.shared_memory)
      continue;
    const auto& ref = *output.shared_memory;
    auto slice = registry.slice(ref.region, ref.offset, ref.byte_size);
    if (!slice)
      return slice.error();
    binding.outputs_.emplace_back(output.name, std::move(*slice));
  }
  return binding;
}

result<std::monostate> shared_memory_binding::write_outputs(const response_view& response) const {
  for (const auto& [name, slice] : outputs_) {
    for (const auto& output : response.outputs) {
      if (output.name != name)
        continue;
      if (output.data.size() > slice.size)
        return bad_request("shared memory size specified with the request for output "
                           + quoted(name) + " (" + std::to_string(slice.size)
                           + " bytes) should be at least " + std::to_string(output.data.size())
                           + " bytes to hold the results; the output has shape "
                           + format_shape(output.shape) + ", so give a "
                           "shared_memory_byte_size of at least that many bytes");
      if (!copy_to_shared_memory(slice.data, output.data.data(), output.data.size()))
        return region_fault("output " + quoted(name),
                            shared_memory_ref{slice.region->name(), 0, slice.size}, "writing");
    }
  }
  return std::monostate{};
}

result<std::monostate> copy_input_data(char* to, const infer_input& input) {
  if (input.data.empty())
    return std::monostate{};
  if (input.shared_memory && !input.owns_data()) {
    if (!copy_from_shared_memory(to, input.data.data(), input.data.size()))
      return region_fault("input " + quoted(input.name), *input.shared_memory, "reading");
    return std::monostate{};
  }
  std::memcpy(to, input.data.data(), input.data.size());
  return std::monostate{};
}

} // namespace caf_serving::ingress
