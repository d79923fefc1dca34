#include "core/responses.hpp"

namespace caf_serving {

void start_response(wire::InferResponse::Builder out, const wire::InferRequest::Reader& req) {
  out.setId(req.getId());
  out.setModelName(req.getModelName());
  out.setModelVersion(req.getModelVersion());
  auto in = req.getTimes();
  auto t = out.initTimes();
  t.setReceivedNs(in.getReceivedNs());
  t.setValidatedNs(in.getValidatedNs());
  t.setEnqueuedNs(in.getEnqueuedNs());
  t.setBatchFormedNs(in.getBatchFormedNs());
  t.setComputeStartNs(in.getComputeStartNs());
  t.setComputeEndNs(in.getComputeEndNs());
  t.setPostprocessEndNs(in.getPostprocessEndNs());
  t.setResponseSentNs(in.getResponseSentNs());
}

response_message error_response(const wire::InferRequest::Reader& req, const serving_error& e) {
  auto msg = response_message::create(512 + e.message.size());
  auto out = msg.builder();
  start_response(out, req);
  auto err = out.initError();
  err.setStatus(static_cast<uint16_t>(e.status));
  err.setMessage(e.message);
  err.setReason(static_cast<wire::FailureReason>(reason_of(e)));
  err.setRetryAfterS(e.retry_after_s);
  return msg;
}

} // namespace caf_serving
