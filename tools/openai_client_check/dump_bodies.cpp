// Writes sample OpenAI bodies of the generate codec (ingress/generate_codec.hpp)
// into a folder, for check.py to serve to the official openai client. Not part of
// the build; see check.py for how to run both.
#include "ingress/generate_codec.hpp"
#include <fstream>
#include <limits>
using namespace caf_serving; using namespace caf_serving::ingress;
static std::string dir = ".";
static void put(const char* name, const std::string& s) { std::ofstream(dir + "/" + name, std::ios::binary) << s; }
int main(int argc, char** argv) {
  if (argc > 1) dir = argv[1];
  openai_object_meta cm{"cmpl-1", 1700000000, "m", "fp_1"}, hm{"chatcmpl-1", 1700000000, "m", ""};
  const top_logprob top[] = {{"Hi", -0.5f}, {"Hello", -1.25f}};
  const token_logprob lp[] = {{"Hi", -0.5f, {top, 2}}, {" \xE2\x82", -std::numeric_limits<float>::infinity(), {}}};
  std::string s;
  openai_result r{cm, {"Hi \xE2\x82", {lp, 2}, true, 0, generation_finish::length}, {3, 2}, generation_timings{3, 1.0, 2, 2.0}};
  append_openai_completion(s, r); put("completion.json", s); s.clear();
  r.meta = hm; r.choice.finish = generation_finish::stop;
  append_openai_chat_completion(s, r); put("chat.json", s); s.clear();
  r.choice.with_logprobs = false; r.choice.logprobs = {};
  append_openai_chat_completion(s, r); put("chat_plain.json", s); s.clear();
  openai_chunk c{hm, {}, true, true};
  append_openai_chat_chunk(s, c); c.first = false; c.choice.text = "Hi"; c.choice.logprobs = {lp, 1}; c.choice.with_logprobs = true;
  append_openai_chat_chunk(s, c); c.choice.text = ""; c.choice.logprobs = {}; c.choice.finish = generation_finish::stop;
  append_openai_chat_chunk(s, c); append_openai_usage_chunk(s, generate_api::openai_chat, hm, {3, 1}); append_sse_done(s);
  put("chat_stream.sse", s); s.clear();
  openai_chunk k{cm, {"Hi", {}, false, 0, generation_finish::none}, false, false};
  append_openai_completion_chunk(s, k); k.choice.text = " there"; k.choice.finish = generation_finish::length;
  append_openai_completion_chunk(s, k); append_sse_done(s); put("completion_stream.sse", s); s.clear();
  const openai_model_card cards[] = {{"m", 1686935002, "caf-serving"}};
  append_openai_model_list(s, {cards, 1}); put("models.json", s); s.clear();
  append_openai_model(s, cards[0]); put("model.json", s); s.clear();
  append_openai_error(s, openai_error_of(bad_request("'max_tokens' must be an integer between 1 and 4294967295, got 0"))); put("error400.json", s); s.clear();
  append_openai_error(s, openai_error_of(not_found("model 'x' not found"))); put("error404.json", s); s.clear();
  c.choice.finish = generation_finish::none; c.choice.text = "partial";
  append_openai_chat_chunk(s, c); append_openai_error_event(s, openai_error_of(unavailable("the model was unloaded"))); put("chat_stream_error.sse", s);
}
