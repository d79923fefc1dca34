/// The bulk channel (bulk_channel.hpp): its frame header and segment table are
/// checked before anything is allocated, its size rule agrees with CAF's
/// serializer, and over loopback a batch reaches an executor gate by its token
/// and comes back as the same bytes, while a wrong token is refused.

#include "cluster/bulk_channel.hpp"
#include "cluster/protocol.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <numeric>

using namespace caf_serving;
using namespace caf_serving::cluster;

namespace {

/// A header written field by field at the offsets the format documents.
std::vector<uint8_t> raw_header(uint32_t magic, uint8_t kind, uint32_t segments,
                                uint64_t request, uint64_t target, uint64_t payload) {
  std::vector<uint8_t> h(bulk::header_bytes, 0);
  std::memcpy(h.data() + 0, &magic, 4);
  h[4] = kind;
  std::memcpy(h.data() + 8, &segments, 4);
  std::memcpy(h.data() + 16, &request, 8);
  std::memcpy(h.data() + 24, &target, 8);
  std::memcpy(h.data() + 32, &payload, 8);
  return h;
}

batch_message make_batch(size_t floats, uint64_t id) {
  auto m = batch_message::create(floats * 4 + 1024);
  auto b = m.builder();
  b.setBatchId(id);
  b.setModelName("identity");
  b.setRows(1);
  b.initRequestRows(1).set(0, 1);
  auto t = b.initInputs(1)[0];
  t.setName("INPUT0");
  t.setDatatype(wire::DataType::FP32);
  auto shape = t.initShape(2);
  shape.set(0, 1);
  shape.set(1, static_cast<int64_t>(floats));
  auto data = t.initData(static_cast<unsigned>(floats * 4));
  std::vector<float> v(floats);
  std::iota(v.begin(), v.end(), static_cast<float>(id));
  std::memcpy(data.begin(), v.data(), data.size());
  return m;
}

} // namespace

TEST_CASE("a header is written at the documented offsets and read back") {
  bulk::frame_header h;
  h.kind = bulk::frame_kind::result;
  h.segments = 3;
  h.request = 77;
  h.target = 1234;
  h.payload_bytes = 3 * 8 + 100 * 8;
  std::vector<uint8_t> bytes(bulk::header_bytes);
  bulk::encode_header(h, bytes.data());
  CHECK(bytes == raw_header(0x31425343, 2, 3, 77, 1234, 824));
  CHECK(std::string(bytes.begin(), bytes.begin() + 4) == "CSB1");
  auto parsed = bulk::parse_header(bytes.data(), 1 << 20);
  CHECK(parsed.error == "");
  auto back = parsed.header;
  CHECK(back.kind == bulk::frame_kind::result);
  CHECK(back.segments == 3);
  CHECK(back.request == 77);
  CHECK(back.target == 1234);
  CHECK(back.payload_bytes == 824);
}

TEST_CASE("a frame longer than the largest accepted is refused before it is allocated") {
  auto fits = raw_header(0x31425343, 1, 1, 1, 1, 4096);
  CHECK(bulk::parse_header(fits.data(), 4096).error == "");
  auto over = raw_header(0x31425343, 1, 1, 1, 1, 4104);
  auto why = bulk::parse_header(over.data(), 4096).error;
  CHECK(why.find("more than the largest accepted (4096)") != std::string::npos);
  // 2^63 bytes: refused by the bound, not by an allocation that fails.
  auto huge = raw_header(0x31425343, 1, 1, 1, 1, uint64_t{1} << 63);
  CHECK(bulk::parse_header(huge.data(), uint64_t{1} << 32).error != "");
}

TEST_CASE("malformed headers are refused with what is wrong") {
  auto magic = raw_header(0x12345678, 1, 1, 1, 1, 16);
  CHECK(bulk::parse_header(magic.data(), 1 << 20).error.find("magic") != std::string::npos);
  auto kind = raw_header(0x31425343, 9, 1, 1, 1, 16);
  CHECK(bulk::parse_header(kind.data(), 1 << 20).error.find("unknown kind 9")
        != std::string::npos);
  auto none = raw_header(0x31425343, 1, 0, 1, 1, 16);
  CHECK(bulk::parse_header(none.data(), 1 << 20).error.find("0 segments") != std::string::npos);
  auto many = raw_header(0x31425343, 1, 513, 1, 1, 513 * 16);
  CHECK(bulk::parse_header(many.data(), 1 << 20).error.find("513 segments")
        != std::string::npos);
  auto ragged = raw_header(0x31425343, 1, 1, 1, 1, 13);
  CHECK(bulk::parse_header(ragged.data(), 1 << 20).error.find("whole segments")
        != std::string::npos);
  auto big_error = raw_header(0x31425343, 3, 0, 1, 0, 65537);
  CHECK(bulk::parse_header(big_error.data(), 1 << 20).error.find("error frame")
        != std::string::npos);
  auto error = raw_header(0x31425343, 3, 0, 1, 0, 200);
  CHECK(bulk::parse_header(error.data(), 1 << 20).error == "");
}

TEST_CASE("the segment table must fill the frame exactly, without wrapping") {
  bulk::frame_header h;
  h.kind = bulk::frame_kind::batch;
  h.segments = 2;
  h.payload_bytes = 2 * 8 + (5 + 7) * 8; // table + 12 words
  auto table = bulk::check_segment_table(h, {5, 7});
  CHECK(table.error == "");
  CHECK(table.total_words == 12);
  CHECK(bulk::check_segment_table(h, {5, 6}).error.find("holds 12") != std::string::npos);
  CHECK(bulk::check_segment_table(h, {5, 8}).error != "");
  // Sizes whose sum wraps around 2^64 to 12.
  CHECK(bulk::check_segment_table(h, {13, ~uint64_t{0}}).error != "");
}

TEST_CASE("wire_bytes is the size CAF's serializer writes for the same batch") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  for (size_t floats : {16, 4096, 300000}) {
    run_batch b{make_batch(floats, 3), nullptr};
    std::vector<char> buf;
    caf::binary_serializer sink(sys, buf);
    REQUIRE_FALSE(sink(b));
    CHECK(bulk::wire_bytes(bulk::segments_of(b)) == buf.size());
  }
}

namespace {

/// Stands in for a worker's executor gate: answers each batch with a result
/// whose single output holds the batch's input bytes and its id.
caf::behavior echo_gate(caf::event_based_actor*) {
  return {
    [](run_batch& b) -> batch_result_message {
      auto in = b.reader();
      auto data = in.getInputs()[0].getData();
      auto m = batch_result_message::create(data.size() + 1024);
      auto r = m.builder();
      r.setBatchId(in.getBatchId());
      auto t = r.initOutputs(1)[0];
      t.setName("OUTPUT0");
      auto d = t.initData(static_cast<unsigned>(data.size()));
      std::memcpy(d.begin(), data.begin(), data.size());
      return m;
    },
  };
}

bulk_client_config client_config(uint16_t port, std::string token) {
  bulk_client_config c;
  c.host = "127.0.0.1";
  c.port = port;
  c.token = std::move(token);
  c.worker = "w";
  c.on_lost = [](const std::string&) {};
  return c;
}

int connect_loopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

/// Connects to the listener on `port` by hand, sends `token`, and checks that
/// the listener closes the connection (within 5 s, not by timing out).
void check_refused(uint16_t port, const std::string& token) {
  int fd = connect_loopback(port);
  REQUIRE(::send(fd, token.data(), token.size(), 0) == static_cast<ssize_t>(token.size()));
  char c;
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  CHECK(::recv(fd, &c, 1, 0) == 0);
  ::close(fd);
}

/// A bulk_client made from `cfg`, once it has connected (within 5 s).
std::shared_ptr<bulk_client> connected_client(caf::actor_system& sys, bulk_client_config cfg) {
  auto client = bulk_client::connect(sys, std::move(cfg));
  for (int i = 0; i < 500 && !client->connected(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(client->connected());
  return client;
}

} // namespace

TEST_CASE("over loopback: batches reach the gate by token, answers come back byte for byte") {
  caf::actor_system_config cfg;
  cluster::configure_actor_system(cfg, {});
  caf::actor_system sys{cfg};
  auto listener = bulk_listener::listen(sys, "127.0.0.1", 0, {});
  REQUIRE(listener);
  auto gate = sys.spawn(echo_gate);
  (*listener)->add_target(gate);

  SUBCASE("a wrong token is refused and the connection closed") {
    (*listener)->issue_token("server-a");
    check_refused((*listener)->port(), std::string(bulk::token_bytes, 'x'));
  }

  SUBCASE("a token admits one connection, and its batches are answered") {
    auto token = (*listener)->issue_token("server-a");
    caf::scoped_actor self{sys};
    auto client = connected_client(sys, client_config((*listener)->port(), token));
    std::vector<batch_message> sent;
    for (uint64_t id : {1, 2, 3}) {
      sent.push_back(make_batch(id == 2 ? 600000 : 1000 * id, id));
      REQUIRE(client->send_batch(run_batch{sent.back(), nullptr}, gate.id(),
                                 caf::actor_cast<caf::actor>(self), id * 10));
    }
    std::set<uint64_t> seen;
    for (int n = 0; n < 3; ++n) {
      self->receive(
        [&](bulk_answer_atom, uint64_t id, batch_result_message& r) {
          auto batch_id = r.reader().getBatchId();
          CHECK(id == batch_id * 10);
          auto out = r.reader().getOutputs()[0].getData();
          auto in = sent[batch_id - 1].reader().getInputs()[0].getData();
          REQUIRE(out.size() == in.size());
          CHECK(std::memcmp(out.begin(), in.begin(), in.size()) == 0);
          CHECK(r.is_received());
          seen.insert(id);
        },
        caf::after(std::chrono::seconds(10)) >> [&] { FAIL("no answer in 10 s"); });
    }
    CHECK(seen == std::set<uint64_t>{10, 20, 30});

    // The same token again: refused (one connection per token).
    check_refused((*listener)->port(), token);
  }

  SUBCASE("a batch for an executor the worker no longer has is answered as lost") {
    auto token = (*listener)->issue_token("server-a");
    caf::scoped_actor self{sys};
    auto client = connected_client(sys, client_config((*listener)->port(), token));
    REQUIRE(client->send_batch(run_batch{make_batch(100, 1), nullptr}, gate.id() + 999,
                               caf::actor_cast<caf::actor>(self), 5));
    self->receive(
      [&](bulk_error_atom, uint64_t id, caf::error& err) {
        CHECK(id == 5);
        CHECK(executor_was_lost(err));
      },
      caf::after(std::chrono::seconds(10)) >> [&] { FAIL("no answer in 10 s"); });
  }

  SUBCASE("a server that cannot connect says no, and the batch takes CAF's link") {
    // A port nobody listens on: the one the listener had, after it is gone.
    auto port = (*listener)->port();
    listener = bulk_listener::listen(sys, "127.0.0.1", 0, {});
    REQUIRE(listener);
    bulk_config quick;
    quick.connect_timeout = std::chrono::milliseconds(500);
    std::atomic<bool> lost{false};
    auto bc = client_config(port, std::string(16, 'a'));
    bc.limits = quick;
    bc.on_lost = [&](const std::string&) { lost = true; };
    auto client = bulk_client::connect(sys, std::move(bc));
    // Until the connect is refused (or times out after 500 ms).
    for (int i = 0; i < 500 && !client->closed(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(client->closed());
    caf::scoped_actor self{sys};
    CHECK_FALSE(client->connected());
    CHECK_FALSE(client->send_batch(run_batch{make_batch(100, 1), nullptr}, gate.id(),
                                   caf::actor_cast<caf::actor>(self), 1));
    CHECK_FALSE(lost.load()); // never connected: not a lost worker
  }
  caf::anon_send_exit(gate, caf::exit_reason::user_shutdown);
}

TEST_CASE("a malformed answer breaks the channel: its batches go back as lost, once") {
  caf::actor_system_config cfg;
  cluster::configure_actor_system(cfg, {});
  caf::actor_system sys{cfg};
  // A fake worker: takes the token and one frame, then answers garbage.
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::listen(lfd, 1) == 0);
  socklen_t len = sizeof(a);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::string token_seen;
  std::thread fake([&] {
    int fd = ::accept(lfd, nullptr, nullptr);
    char buf[16 + bulk::header_bytes];
    size_t got = 0;
    while (got < sizeof(buf)) {
      auto n = ::recv(fd, buf + got, sizeof(buf) - got, 0);
      if (n <= 0)
        break;
      got += static_cast<size_t>(n);
    }
    token_seen.assign(buf, 16);
    auto garbage = raw_header(0xdeadbeef, 2, 1, 1, 0, 8);
    (void) !::send(fd, garbage.data(), garbage.size(), 0);
    char c;
    while (::recv(fd, &c, 1, 0) > 0) {
    }
    ::close(fd);
  });
  std::mutex m;
  std::vector<std::string> lost;
  auto bc = client_config(ntohs(a.sin_port), std::string(16, 't'));
  bc.on_lost = [&](const std::string& why) {
    std::lock_guard<std::mutex> g(m);
    lost.push_back(why);
  };
  auto client = connected_client(sys, std::move(bc));
  caf::scoped_actor self{sys};
  REQUIRE(client->send_batch(run_batch{make_batch(100, 1), nullptr}, 7,
                             caf::actor_cast<caf::actor>(self), 3));
  self->receive([&](bulk_lost_atom, const std::string& why) {
                  CHECK(why.find("magic") != std::string::npos);
                },
                caf::after(std::chrono::seconds(10)) >> [&] { FAIL("no loss in 10 s"); });
  fake.join();
  ::close(lfd);
  CHECK(token_seen == std::string(16, 't'));
  CHECK(client->closed());
  // on_lost runs on the reader thread right after the batches were sent back.
  auto told = [&] {
    std::lock_guard<std::mutex> g(m);
    return !lost.empty();
  };
  for (int i = 0; i < 500 && !told(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::lock_guard<std::mutex> g(m);
  REQUIRE(lost.size() == 1);
  CHECK(lost[0].find("magic") != std::string::npos);
}
