#pragma once
/// What the generate endpoints need of a generative model (issue 34): its
/// generation actor, tokenizer, chat template and limits. A model_pipeline
/// holds one for a model served with `model_transaction_policy { decoupled:
/// true }`; server/generative_loader.hpp builds it.

#include "scheduler/generation_actor.hpp"
#include "scheduler/generation_policy.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace caf_serving::text {
class tokenizer;
class chat_template;
} // namespace caf_serving::text

namespace caf_serving::server {

struct generative_model {
  scheduler::generation_actor actor;
  std::shared_ptr<const text::tokenizer> tokenizer;
  /// The model's chat template (tokenizer_config.json's chat_template or
  /// chat_template.jinja); null when it has none (chat requests are then a
  /// 400).
  std::shared_ptr<const text::chat_template> chat_template;
  std::shared_ptr<scheduler::generation_stats> stats;
  scheduler::generation_limits limits;
  /// The special tokens' texts, as the chat template reads them.
  std::string bos_token;
  std::string eos_token;
  /// Whether the tokenizer adds its special tokens (a bos) to a prompt;
  /// tokenizer_config.json's add_bos_token where it says so.
  bool add_special_tokens = true;
  /// When the model was loaded (seconds since the epoch), for /v1/models.
  int64_t created_s = 0;
};

} // namespace caf_serving::server
