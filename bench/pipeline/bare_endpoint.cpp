/// A bare HTTP endpoint on the same kj-http stack as caf-serving's ingress, that
/// answers every request at once with a fixed KServe response of identity_fp32's
/// shape, without parsing, actors or batching: the transport's limit on this
/// machine, which the pipeline benchmark compares the full server against.

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

class bare_service final : public kj::HttpService {
public:
  explicit bare_service(const kj::HttpHeaderTable& table) : table_(table) {}

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders&,
                            kj::AsyncInputStream& body, Response& out) override {
    const std::string* answer = &response;
    if (method == kj::HttpMethod::GET && url.endsWith("/stats"))
      answer = &stats_;
    else if (method == kj::HttpMethod::GET)
      answer = &metadata;
    return body.readAllBytes().then([this, answer, &out](kj::Array<kj::byte>) {
      kj::HttpHeaders headers(table_);
      headers.set(kj::HttpHeaderId::CONTENT_TYPE, "application/json");
      auto stream = out.send(200, "OK", headers, uint64_t{answer->size()});
      auto promise = stream->write(answer->data(), answer->size());
      return promise.attach(kj::mv(stream));
    });
  }

private:
  const kj::HttpHeaderTable& table_;
  const std::string stats_ = R"({"model_stats":[]})";
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
  kj::HttpHeaderTable table;
  bare_service service(table);
  kj::HttpServer server(io.provider->getTimer(), table, service);
  auto listener
    = io.provider->getNetwork().parseAddress("127.0.0.1", port).wait(io.waitScope)->listen();
  std::cout << "HTTP listening on 127.0.0.1:" << listener->getPort() << std::endl;
  auto stop = io.unixEventPort.onSignal(SIGINT).ignoreResult().exclusiveJoin(
    io.unixEventPort.onSignal(SIGTERM).ignoreResult());
  server.listenHttp(*listener).exclusiveJoin(kj::mv(stop)).wait(io.waitScope);
  return 0;
}
