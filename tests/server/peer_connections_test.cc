#include "server/service/peer_connections.h"

#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "gtest/gtest.h"

namespace hostkv {
namespace {

// One end of a new socket pair (the other end closed).
int NewSocket() {
  int ends[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, ends), 0);
  close(ends[1]);
  return ends[0];
}

TEST(PeerConnectionsTest, EachUidUpToItsBound) {
  PeerConnections peers(3);
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) {
    fds.push_back(NewSocket());
    EXPECT_TRUE(peers.Admit(1000, fds.back()));
  }
  const int fourth = NewSocket();
  EXPECT_FALSE(peers.Admit(1000, fourth));
  EXPECT_TRUE(peers.Admit(1001, fourth));  // another uid's share
  EXPECT_EQ(peers.Open(1000), 3u);
  EXPECT_EQ(peers.Open(1001), 1u);
  for (int fd : fds) close(fd);
  close(fourth);
}

TEST(PeerConnectionsTest, AClosedConnectionGivesItsPlaceBack) {
  PeerConnections peers(2);
  const int a = NewSocket(), b = NewSocket();
  ASSERT_TRUE(peers.Admit(7, a));
  ASSERT_TRUE(peers.Admit(7, b));
  close(a);  // gRPC closed it: nobody is told
  const int c = NewSocket();  // may take a's number
  EXPECT_TRUE(peers.Admit(7, c));
  EXPECT_EQ(peers.Open(7), 2u);
  close(b);
  close(c);
  EXPECT_EQ(peers.Open(7), 0u);
}

TEST(PeerConnectionsTest, AReusedNumberIsANewConnectionOfItsNewUid) {
  PeerConnections peers(1);
  const int a = NewSocket();
  ASSERT_TRUE(peers.Admit(7, a));
  close(a);
  const int b = NewSocket();
  ASSERT_EQ(b, a);  // the lowest free number
  EXPECT_TRUE(peers.Admit(8, b));
  EXPECT_EQ(peers.Open(7), 0u);
  EXPECT_EQ(peers.Open(8), 1u);
  // uid 7's share is whole again.
  const int c = NewSocket();
  EXPECT_TRUE(peers.Admit(7, c));
  close(b);
  close(c);
}

TEST(PeerConnectionsTest, ANumberReusedByAnotherSocketBehindItsBackIsNotCounted) {
  PeerConnections peers(1);
  const int a = NewSocket();
  ASSERT_TRUE(peers.Admit(7, a));
  close(a);
  const int b = NewSocket();  // same number, another socket, never admitted
  ASSERT_EQ(b, a);
  EXPECT_EQ(peers.Open(7), 0u);
  close(b);
}

TEST(PeerConnectionsTest, NoBoundAndNotASocket) {
  PeerConnections unbounded(0);
  std::vector<int> fds;
  for (int i = 0; i < 100; ++i) {
    fds.push_back(NewSocket());
    EXPECT_TRUE(unbounded.Admit(1, fds.back()));
  }
  EXPECT_EQ(unbounded.Open(1), 100u);
  for (int fd : fds) close(fd);
  int pipe_ends[2];
  ASSERT_EQ(pipe(pipe_ends), 0);
  EXPECT_FALSE(unbounded.Admit(1, pipe_ends[0]));
  EXPECT_FALSE(unbounded.Admit(1, -1));
  close(pipe_ends[0]);
  close(pipe_ends[1]);
}

}  // namespace
}  // namespace hostkv
