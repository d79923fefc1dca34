#pragma once
/// The inference side of the shared-memory extension: inputs whose bytes are
/// read from registered regions, and outputs written into them.
///
/// Usage, in the HTTP server's infer path:
///
///   auto bound = bind_shared_memory(request, registry, model.config);
///   if (!bound) answer(bound.error());            // 404/400 as Triton
///   // validate(request, ...) as usual: shared-memory inputs now have data
///   // copy each input's data into the request message with
///   // copy_input_data(), which survives a region truncated under it
///   ...
///   auto written = bound->write_outputs(response_view, model.config.name);
///   if (!written) answer(written.error());
///   // serialize_infer_response leaves those outputs' data out
///
/// The binding holds every region it uses mapped until it is destroyed, so it
/// must live as long as the request (a region unregistered meanwhile stays
/// mapped for it).

#include "core/error.hpp"
#include "core/model_config.hpp"
#include "ingress/kserve_codec.hpp"
#include "ingress/shared_memory.hpp"

#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace caf_serving::ingress {

class shared_memory_binding {
public:
  shared_memory_binding() = default;

  /// Writes each output of `response` that the request sent to shared memory
  /// into its window: 400 with Triton's phrase ("shared memory size specified
  /// with the request for output 'x' (N bytes) should be at least M bytes to
  /// hold the results") when the window is too small, or when the region's
  /// memory faults.
  result<std::monostate> write_outputs(const response_view& response) const;

  /// Whether the request uses shared memory at all.
  bool empty() const { return inputs_.empty() && outputs_.empty(); }

private:
  friend result<shared_memory_binding> bind_shared_memory(infer_request&,
                                                          const shared_memory_registry&,
                                                          const model_config&);
  std::vector<region_slice> inputs_;
  std::vector<std::pair<std::string, region_slice>> outputs_;
};

/// Resolves the shared-memory windows of `request`'s inputs and outputs
/// (404 for a region not registered, 400 for a window outside its region, as
/// Triton), checks that each input's window has exactly its tensor's byte size
/// (Triton's "input byte size mismatch for input 'x' for model 'm'. Expected
/// N, got M"), and points each such input's `data` into its region. BYTES
/// inputs are copied out of the region instead (validation reads their
/// lengths, which must not fault).
result<shared_memory_binding> bind_shared_memory(infer_request& request,
                                                 const shared_memory_registry& registry,
                                                 const model_config& model);

/// Copies `input.data` to `to`: a plain memcpy, or for data in shared memory a
/// copy that fails (400) instead of crashing when the region faults.
result<std::monostate> copy_input_data(char* to, const infer_input& input);

} // namespace caf_serving::ingress
