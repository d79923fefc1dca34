#pragma once
/// The admission step of generative requests (issue 34), the same for every
/// protocol that carries them (Triton's generate endpoints, the OpenAI
/// endpoints, gRPC's ModelStreamInfer): check the sampling and stop parameters,
/// render the chat template, tokenize the prompt, check it against the
/// model's context, and hand the job to the model's generation actor.
/// Protocols parse (generate_codec.hpp), call this, and write what comes back.
///
///   auto admitted = admit_generation(*model, request);
///   if (!admitted) answer(admitted.error());          // 400, naming the field
///   admitted->job->sink = my_sink;
///   submit_generation(*model, admitted->job);
///   ...                                               // the client went away:
///   cancel_generation(*model, admitted->job->id);

#include "core/error.hpp"
#include "ingress/generate_codec.hpp"
#include "scheduler/generation_actor.hpp"
#include "server/model_directory.hpp"

#include <memory>
#include <string>

namespace caf_serving::ingress {

struct admitted_generation {
  /// The job, its id set; the protocol sets its sink.
  std::shared_ptr<scheduler::generation_job> job;
  /// The prompt as the model reads it (the rendered chat template, or the
  /// decoded token ids), for echo.
  std::string prompt_text;
};

/// Checks and tokenizes `request` for `model`; errors are 400s naming what
/// was wrong.
result<admitted_generation> admit_generation(const server::model_pipeline& model,
                                             const generate_request& request);

/// Hands `job` (its sink set) to the model's generation actor.
void submit_generation(const server::model_pipeline& model,
                       std::shared_ptr<scheduler::generation_job> job);

/// A generative request answered whole: counted in the model's statistics
/// (inference and execution counts, success time, request latency) from
/// `received_ns` (now_ns) until now, as every protocol counts it.
void record_generation(const server::model_pipeline& model, int64_t received_ns);

/// The client went away: the sequence ends and its cache blocks are freed
/// before the next step. Nothing when it has ended already.
void cancel_generation(const server::model_pipeline& model, uint64_t id);

} // namespace caf_serving::ingress
