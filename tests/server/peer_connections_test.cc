#include "server/service/peer_connections.h"

#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace hostkv {
namespace {

bool Admitted(PeerConnections& peers, uid_t uid, int fd) {
  return peers.Admit(uid, fd) == PeerConnections::Admission::kAdmitted;
}

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
    EXPECT_TRUE(Admitted(peers, 1000, fds.back()));
  }
  const int fourth = NewSocket();
  EXPECT_FALSE(Admitted(peers, 1000, fourth));
  EXPECT_TRUE(Admitted(peers, 1001, fourth));  // another uid's share
  EXPECT_EQ(peers.Open(1000), 3u);
  EXPECT_EQ(peers.Open(1001), 1u);
  for (int fd : fds) close(fd);
  close(fourth);
}

TEST(PeerConnectionsTest, AClosedConnectionGivesItsPlaceBack) {
  PeerConnections peers(2);
  const int a = NewSocket(), b = NewSocket();
  ASSERT_TRUE(Admitted(peers, 7, a));
  ASSERT_TRUE(Admitted(peers, 7, b));
  close(a);  // gRPC closed it: nobody is told
  const int c = NewSocket();  // may take a's number
  EXPECT_TRUE(Admitted(peers, 7, c));
  EXPECT_EQ(peers.Open(7), 2u);
  close(b);
  close(c);
  EXPECT_EQ(peers.Open(7), 0u);
}

TEST(PeerConnectionsTest, AReusedNumberIsANewConnectionOfItsNewUid) {
  PeerConnections peers(1);
  const int a = NewSocket();
  ASSERT_TRUE(Admitted(peers, 7, a));
  close(a);
  const int b = NewSocket();
  ASSERT_EQ(b, a);  // the lowest free number
  EXPECT_TRUE(Admitted(peers, 8, b));
  EXPECT_EQ(peers.Open(7), 0u);
  EXPECT_EQ(peers.Open(8), 1u);
  // uid 7's share is whole again.
  const int c = NewSocket();
  EXPECT_TRUE(Admitted(peers, 7, c));
  close(b);
  close(c);
}

TEST(PeerConnectionsTest, ANumberReusedByAnotherSocketBehindItsBackIsNotCounted) {
  PeerConnections peers(1);
  const int a = NewSocket();
  ASSERT_TRUE(Admitted(peers, 7, a));
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
    EXPECT_TRUE(Admitted(unbounded, 1, fds.back()));
  }
  EXPECT_EQ(unbounded.Open(1), 100u);
  for (int fd : fds) close(fd);
  int pipe_ends[2];
  ASSERT_EQ(pipe(pipe_ends), 0);
  EXPECT_FALSE(Admitted(unbounded, 1, pipe_ends[0]));
  EXPECT_FALSE(Admitted(unbounded, 1, -1));
  close(pipe_ends[0]);
  close(pipe_ends[1]);
}

// All uids together up to the total; its last eighth only for uids holding
// few (here under one: 16 / 64), and closed connections counted out.
TEST(PeerConnectionsTest, AllUidsUpToTheTotalTheLastEighthForNewcomers) {
  PeerConnections peers(/*max_per_uid=*/8, /*max_total=*/16);
  std::vector<int> fds;
  for (uid_t uid : {1000, 1001}) {
    for (int i = 0; i < 7; ++i) {
      fds.push_back(NewSocket());
      ASSERT_TRUE(Admitted(peers, uid, fds.back()));
    }
  }
  // 14 of 16 held: the last eighth (2) is for uids holding none.
  const int more = NewSocket();
  EXPECT_EQ(peers.Admit(1002, more), PeerConnections::Admission::kAdmitted);
  const int again = NewSocket();
  EXPECT_EQ(peers.Admit(1000, again), PeerConnections::Admission::kOverTotal);
  EXPECT_EQ(peers.Admit(1002, again), PeerConnections::Admission::kOverTotal);
  EXPECT_EQ(peers.Admit(1003, again), PeerConnections::Admission::kAdmitted);
  const int full = NewSocket();
  EXPECT_EQ(peers.Admit(1004, full), PeerConnections::Admission::kOverTotal);
  // Connections closed since are counted out when the total is reached.
  for (int i = 0; i < 4; ++i) {
    close(fds.back());
    fds.pop_back();
  }
  absl::SleepFor(absl::Milliseconds(150));  // the recount's pace
  EXPECT_EQ(peers.Admit(1004, full), PeerConnections::Admission::kAdmitted);
  for (int fd : fds) close(fd);
  close(more);
  close(again);
  close(full);
}

}  // namespace
}  // namespace hostkv
