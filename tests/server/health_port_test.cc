// The plaintext health-only port (--health-listen): kubelet's gRPC probes cannot speak TLS, so
// while the API serves TLS the probes ask a second, plaintext server that answers the standard
// health service and nothing else, with the main server's status.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <string>

#include "remat/v1/remat.grpc.pb.h"
#include "server/coordinator.h"

namespace remat::server {
namespace {

// grpc.health.v1.Health/Check for the whole server ("" service); returns the status byte
// (1 SERVING, 2 NOT_SERVING) or -1 when the call failed, with the call's code in `code`.
int HealthCheck(const std::shared_ptr<grpc::Channel>& channel, grpc::StatusCode* code) {
  grpc::GenericStub generic(channel);
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1), response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) { done.set_value(s); });
  const grpc::Status st = done.get_future().get();
  *code = st.error_code();
  if (!st.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes.size() == 2 && bytes[0] == '\x08' ? bytes[1] : (bytes.empty() ? 0 : -1);
}

TEST(HealthPortTest, PlaintextHealthBesideTlsApiAndNothingElse) {
  char tmpl[] = "/tmp/remat-health-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " + dir + "/key.pem -out " +
      dir + "/cert.pem > /dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl cannot make a test certificate";

  CoordinatorOptions o;
  o.db_path = ":memory:";
  o.listen = "127.0.0.1:0";
  o.health_listen = "127.0.0.1:0";
  o.tls_cert_file = dir + "/cert.pem";
  o.tls_key_file = dir + "/key.pem";
  auto c = Coordinator::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Start().ok());
  ASSERT_GT((*c)->health_port(), 0);
  ASSERT_NE((*c)->health_port(), (*c)->port());

  auto health = grpc::CreateChannel("127.0.0.1:" + std::to_string((*c)->health_port()),
                                    grpc::InsecureChannelCredentials());
  grpc::StatusCode code;
  EXPECT_EQ(HealthCheck(health, &code), 1) << code;  // SERVING, in plain text

  // The API is not reachable through the health port.
  auto users = v1::RematService::NewStub(health);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListSearchesResponse listed;
  EXPECT_EQ(users->ListSearches(&ctx, v1::ListSearchesRequest(), &listed).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  // The main port still refuses plain text.
  auto plain_api = grpc::CreateChannel("127.0.0.1:" + std::to_string((*c)->port()),
                                       grpc::InsecureChannelCredentials());
  EXPECT_EQ(HealthCheck(plain_api, &code), -1);

  (*c)->Shutdown(std::chrono::milliseconds(100));
  EXPECT_NE(HealthCheck(health, &code), 1);  // gone or NOT_SERVING once stopped
  std::filesystem::remove_all(dir);
}

TEST(HealthPortTest, BadHealthAddressNamesTheFlag) {
  CoordinatorOptions o;
  o.db_path = ":memory:";
  o.health_listen = "nowhere";
  auto c = Coordinator::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("health-listen"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace remat::server
