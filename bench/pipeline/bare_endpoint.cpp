/// A bare HTTP endpoint on the same kj-http stack as caf-serving's ingress, that
/// answers every request at once with a fixed KServe response of identity_fp32's
/// shape, without parsing, actors or batching: the transport's limit on this
/// machine, which the pipeline benchmark compares the full server against.
/// A request in the binary tensor extension (Inference-Header-Content-Length)
/// gets the same answer in that extension. GET .../stats answers how many
/// inference requests were answered, in the place of Triton's statistics
/// where the benchmark reads the server's count (success/count).

#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <kj/compat/http.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

namespace {

const std::string metadata
  = R"({"name":"identity_fp32","versions":["1"],"platform":"builtin",)"
    R"("inputs":[{"name":"INPUT0","datatype":"FP32","shape":[-1,16]}],)"
    R"("outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[-1,16]}]})";

const std::string response
  = R"({"model_name":"identity_fp32","model_version":"1","outputs":[{"name":"OUTPUT0",)"
    R"("datatype":"FP32","shape":[1,16],"data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}]})";

const std::string binary_header
  = R"({"model_name":"identity_fp32","model_version":"1","outputs":[{"name":"OUTPUT0",)"
    R"("datatype":"FP32","shape":[1,16],"parameters":{"binary_data_size":64}}]})";

/// The binary answer: the JSON header, then 16 floats 0..15.
std::string binary_response() {
  std::string out = binary_header;
  for (int i = 0; i < 16; ++i) {
    float f = static_cast<float>(i);
    out.append(reinterpret_cast<const char*>(&f), sizeof(f));
  }
  return out;
}

class bare_service final : public kj::HttpService {
public:
  bare_service(const kj::HttpHeaderTable& table, kj::HttpHeaderId header_length)
      : table_(table), header_length_(header_length) {}

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            Response& out) override {
    const std::string* answer = &response;
    bool binary = headers.get(header_length_) != nullptr;
    if (method == kj::HttpMethod::GET && url.endsWith("/stats")) {
      stats_ = R"({"model_stats":[{"inference_stats":{"success":{"count":)"
               + std::to_string(answered_) + "}}}]}";
      answer = &stats_;
      binary = false;
    } else if (method == kj::HttpMethod::GET) {
      answer = &metadata;
    } else if (binary) {
      answer = &binary_;
    }
    return body.readAllBytes().then([this, answer, binary, &out](kj::Array<kj::byte>) {
      kj::HttpHeaders headers(table_);
      headers.set(kj::HttpHeaderId::CONTENT_TYPE,
                  binary ? "application/octet-stream" : "application/json");
      if (binary)
        headers.set(header_length_, kj::str(binary_header.size()));
      if (answer == &response || answer == &binary_)
        ++answered_;
      auto stream = out.send(200, "OK", headers, uint64_t{answer->size()});
      auto promise = stream->write(answer->data(), answer->size());
      return promise.attach(kj::mv(stream));
    });
  }

private:
  const kj::HttpHeaderTable& table_;
  kj::HttpHeaderId header_length_;
  const std::string binary_ = binary_response();
  std::string stats_;
  uint64_t answered_ = 0;
};

} // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::cout << "usage: bare-http-endpoint [PORT]\n"
                 "Answers every HTTP request on 127.0.0.1:PORT (0 or absent: a free port) at once\n"
                 "with a fixed identity_fp32 KServe response; prints the port; stops on SIGTERM.\n";
    return 0;
  }
  unsigned port = argc > 1 ? static_cast<unsigned>(std::strtoul(argv[1], nullptr, 10)) : 0;
  kj::UnixEventPort::captureSignal(SIGINT);
  kj::UnixEventPort::captureSignal(SIGTERM);
  auto io = kj::setupAsyncIo();
  kj::HttpHeaderTable::Builder builder;
  auto header_length = builder.add("Inference-Header-Content-Length");
  auto table = builder.build();
  bare_service service(*table, header_length);
  kj::HttpServer server(io.provider->getTimer(), *table, service);
  auto listener
    = io.provider->getNetwork().parseAddress("127.0.0.1", port).wait(io.waitScope)->listen();
  std::cout << "HTTP listening on 127.0.0.1:" << listener->getPort() << std::endl;
  auto stop = io.unixEventPort.onSignal(SIGINT).ignoreResult().exclusiveJoin(
    io.unixEventPort.onSignal(SIGTERM).ignoreResult());
  server.listenHttp(*listener).exclusiveJoin(kj::mv(stop)).wait(io.waitScope);
  return 0;
}
