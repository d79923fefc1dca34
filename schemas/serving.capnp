@0xe90ce2acaff2ea0a;
# Messages between caf-serving's stages (DESIGN.md, "Messages are Cap'n Proto").
#
# Inside one process a message travels as a reference-counted Cap'n Proto message
# and is never copied; between processes the same bytes travel through CAF's
# serialization. Tensor data is always a raw `Data` field: little-endian elements,
# row-major, and for BYTES a sequence of (4-byte little-endian length, bytes).
#
# Times are nanoseconds on the process's monotonic clock (std::chrono::steady_clock
# since its epoch). They are only compared within the process that took them; a
# remote executor reports durations, never its own clock readings. Zero always
# means "this stage was not reached".

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("caf_serving::wire");

# KServe v2 datatypes. The ordinals match caf_serving::datatype.
enum DataType {
  bool @0;
  uint8 @1;
  uint16 @2;
  uint32 @3;
  uint64 @4;
  int8 @5;
  int16 @6;
  int32 @7;
  int64 @8;
  fp16 @9;
  bf16 @10;
  fp32 @11;
  fp64 @12;
  bytes @13;
}

struct Tensor {
  name @0 :Text;        # input or output name as in config.pbtxt
  datatype @1 :DataType;
  shape @2 :List(Int64);
  # Full shape including the batch dimension when the model batches. Never -1.
  data @3 :Data;
  # Raw elements, see the header comment. Its size is checked against the shape by
  # the ingress before a request enters the pipeline.
}

# Per-request stage timestamps, in monotonic nanoseconds (see the header comment).
struct StageTimes {
  receivedNs @0 :Int64;        # ingress: the request's headers were read
  validatedNs @1 :Int64;       # ingress: body parsed and checked against the model
  enqueuedNs @2 :Int64;        # scheduler: the request entered the queue
  batchFormedNs @3 :Int64;     # scheduler: the request was put into a batch
  computeStartNs @4 :Int64;    # executor: the batch's compute began
  computeEndNs @5 :Int64;      # executor: the batch's outputs were complete
  postprocessEndNs @6 :Int64;  # post-processor: this request's response was built
  responseSentNs @7 :Int64;    # ingress: the response was handed to the socket
}

struct RequestedOutput {
  name @0 :Text;
  binary @1 :Bool;             # answer with the binary tensor extension
  classification @2 :UInt32;   # 0: raw tensor; k > 0: top-k classification strings
}

struct InferRequest {
  id @0 :Text;                 # the client's optional request id, echoed back
  modelName @1 :Text;
  modelVersion @2 :Int64;      # resolved by the ingress; never 0
  inputs @3 :List(Tensor);
  outputs @4 :List(RequestedOutput);
  # Empty: every output of the model, in config order.
  priority @5 :UInt32;         # 0: the model's default priority level
  timeoutUs @6 :UInt64;        # 0: the model's default queue timeout
  rows @7 :UInt32;             # batch dimension of the inputs; 1 for a non-batching model
  times @8 :StageTimes;
}

# Why a request failed; counted per reason on /metrics. Matches caf_serving::failure_reason.
enum FailureReason {
  badRequest @0;
  queueFull @1;
  timeout @2;
  unavailable @3;
  internal @4;
}

struct Error {
  status @0 :UInt16;           # HTTP status as Triton maps it (400, 404, 503, ...); 0: no error
  message @1 :Text;            # says what was wrong and how to fix it
  reason @2 :FailureReason;    # meaningful only when status is not 0
  retryAfterS @3 :UInt32;      # seconds the client should wait before retrying (HTTP
                               # Retry-After); 0: no advice. Set on a shed request.
}

struct InferResponse {
  id @0 :Text;
  modelName @1 :Text;
  modelVersion @2 :Int64;
  outputs @3 :List(Tensor);
  times @4 :StageTimes;
  error @5 :Error;             # status 0: success, `outputs` are valid
}

# A batch the scheduler hands to an executor: each input is the requests' tensors
# gathered along the batch dimension, in the order of `requestRows`.
struct Batch {
  batchId @0 :UInt64;          # unique per scheduler; echoed in the BatchResult
  modelName @1 :Text;
  modelVersion @2 :Int64;
  rows @3 :UInt32;             # total batch dimension (sum of requestRows)
  requestRows @4 :List(UInt32);# rows contributed by each request, in order
  inputs @5 :List(Tensor);
}

struct BatchResult {
  batchId @0 :UInt64;
  outputs @1 :List(Tensor);    # every model output, batched like the inputs
  computeInputNs @2 :Int64;    # duration: staging inputs for the device or kernels
  computeInferNs @3 :Int64;    # duration: the model itself
  computeOutputNs @4 :Int64;   # duration: collecting outputs
  error @5 :Error;             # status 0: success
}
