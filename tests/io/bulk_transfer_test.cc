// Bulk transfers: a real server on loopback, real files, real sockets.
#include "io/bulk_transfer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::io {
namespace {

using ::testing::HasSubstr;

class BulkTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = BulkServer::Start("127.0.0.1");
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    std::mt19937_64 rng(testing::TestSeed());
    // 9 MiB and a bit: several sendfile and recv rounds, an odd size.
    std::vector<uint8_t> bytes = testing::RandomBytes(rng, (9 << 20) + 4093);
    contents_.assign(bytes.begin(), bytes.end());
    path_ = dir_.File("shard.ckpt");
    testing::WriteAll(path_, contents_);
  }
  absl::Status Fetch(const std::string& ticket, std::string* into) {
    return BulkFetch(
        "127.0.0.1", server_->port(), ticket,
        absl::MakeSpan(reinterpret_cast<uint8_t*>(into->data()), into->size()),
        absl::Seconds(10));
  }

  testing::TempDir dir_;
  std::unique_ptr<BulkServer> server_;
  std::string contents_, path_;
};

TEST_F(BulkTransferTest, SendsTheOfferedFileOnceEvenIfItIsUnlinkedMeanwhile) {
  auto ticket = server_->Offer(path_);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  EXPECT_EQ(ticket->bytes, contents_.size());
  EXPECT_EQ(ticket->token.size(), BulkServer::kTicketBytes);
  // Garbage collection drops the file after the offer: the transfer is whole.
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  std::string got(contents_.size(), '\0');
  absl::Status s = Fetch(ticket->token, &got);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(got == contents_);
  EXPECT_EQ(server_->outstanding(), 0u);
  // A ticket is good for one transfer.
  s = Fetch(ticket->token, &got);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("ticket is unknown"));
}

// A file that is not one on disk (an incremental shard's self-contained
// view) is sent by reads of it, piece by piece.
TEST_F(BulkTransferTest, SendsAnOfferedReadableFile) {
  auto file = DefaultFileSystem()->NewReadableFile(path_, {});
  ASSERT_TRUE(file.ok()) << file.status();
  auto ticket = server_->Offer(*std::move(file), contents_.size());
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  EXPECT_EQ(ticket->bytes, contents_.size());
  std::string got(contents_.size(), '\0');
  absl::Status s = Fetch(ticket->token, &got);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(got == contents_);
  EXPECT_EQ(server_->outstanding(), 0u);
  // A file shorter than offered: the receiver gets an error, never a short
  // success.
  file = DefaultFileSystem()->NewReadableFile(path_, {});
  ASSERT_TRUE(file.ok());
  ticket = server_->Offer(*std::move(file), contents_.size() + 4096);
  ASSERT_TRUE(ticket.ok());
  std::string longer(contents_.size() + 4096, '\0');
  EXPECT_FALSE(Fetch(ticket->token, &longer).ok());
  EXPECT_FALSE(server_->Offer(std::unique_ptr<io::ReadableFile>(), 1).ok());
}

TEST_F(BulkTransferTest, RefusesUnknownTicketsWrongSizesAndMissingFiles) {
  std::string got(contents_.size(), '\0');
  absl::Status s = Fetch(std::string(BulkServer::kTicketBytes, 'x'), &got);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  auto ticket = server_->Offer(path_);
  ASSERT_TRUE(ticket.ok());
  std::string small(100, '\0');
  s = Fetch(ticket->token, &small);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("100 expected"));
  auto missing = server_->Offer(dir_.File("nope.ckpt"));
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.ckpt"));
  // Nobody listens there any more once the server is gone.
  const int port = server_->port();
  auto pending = server_->Offer(path_);
  ASSERT_TRUE(pending.ok());
  server_.reset();
  s = BulkFetch(
      "127.0.0.1", port, pending->token,
      absl::MakeSpan(reinterpret_cast<uint8_t*>(got.data()), got.size()),
      absl::Seconds(5));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("127.0.0.1"));
}

TEST_F(BulkTransferTest, ConcurrentTransfersEachGetTheirFile) {
  std::vector<std::string> paths, contents;
  std::mt19937_64 rng(testing::TestSeed() + 1);
  for (int i = 0; i < 4; ++i) {
    std::vector<uint8_t> b = testing::RandomBytes(rng, (1 << 20) * (i + 1));
    contents.emplace_back(b.begin(), b.end());
    paths.push_back(dir_.File("f" + std::to_string(i)));
    testing::WriteAll(paths.back(), contents.back());
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(4);
  std::vector<std::string> got(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto t = server_->Offer(paths[i]);
      if (!t.ok()) {
        results[i] = t.status();
        return;
      }
      got[i].resize(t->bytes);
      results[i] = Fetch(t->token, &got[i]);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(results[i].ok()) << results[i];
    EXPECT_TRUE(got[i] == contents[i]) << i;
  }
}

// A connection to `port` on loopback that sends nothing; -1 if refused.
int SilentConnection(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A flood of connections that never present a ticket holds at most
// max_connections server threads, each for at most the ticket's deadline:
// the server then serves again, and offers beyond max_tickets are refused
// by name.
TEST_F(BulkTransferTest, FloodsOfConnectionsAndOffersAreBounded) {
  auto s = BulkServer::Start(
      "127.0.0.1", BulkLimits{.max_connections = 8, .max_tickets = 4});
  ASSERT_TRUE(s.ok()) << s.status();
  server_ = *std::move(s);
  std::vector<int> flood;
  for (int i = 0; i < 1000; ++i) {
    if (int fd = SilentConnection(server_->port()); fd >= 0)
      flood.push_back(fd);
  }
  EXPECT_GT(flood.size(), 0u);
  for (int i = 0; i < 100 && server_->refused_connections() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_GT(server_->refused_connections(), 0u);

  // The flood stays open; a fetch goes through once the silent connections
  // served have been dropped at their ticket's deadline.
  auto ticket = server_->Offer(path_);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  std::string got(contents_.size(), '\0');
  absl::Status fetched;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  do {
    fetched = Fetch(ticket->token, &got);
    if (!fetched.ok()) absl::SleepFor(absl::Milliseconds(200));
  } while (!fetched.ok() && absl::Now() < deadline);
  ASSERT_TRUE(fetched.ok()) << fetched;
  EXPECT_TRUE(got == contents_);
  for (int fd : flood) ::close(fd);

  for (int i = 0; i < 4; ++i) ASSERT_TRUE(server_->Offer(path_).ok()) << i;
  auto refused = server_->Offer(path_);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("4 tickets are outstanding"));
}

// Tickets are unpredictable: no two of many are equal, and their bytes are
// spread (a counter or a clock would not be).
TEST_F(BulkTransferTest, TicketsAreRandom) {
  std::set<std::string> seen;
  std::array<int, 256> counts{};
  for (int i = 0; i < 2000; ++i) {
    auto t = server_->Offer(path_);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(seen.insert(t->token).second);
    for (char c : t->token) ++counts[static_cast<uint8_t>(c)];
  }
  // 32000 bytes over 256 values: about 125 each.
  for (int c : counts) EXPECT_GT(c, 40);
}

}  // namespace
}  // namespace ckpt::io
