// Hosts as ckpt's flags and gRPC write them ("10.0.0.2", "[::1]", "node1",
// "ipv4:10.0.0.2:5000"): the bare host, whether it is loopback, and which
// addresses a name stands for. Used to decide where plaintext may go and
// whom ckptd may dial.
//
// Thread-safety: pure functions (name resolution through getaddrinfo).
#ifndef CKPT_IO_HOST_H_
#define CKPT_IO_HOST_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::io {

// "[::1]" -> "::1"; anything else as it is.
std::string BareHost(absl::string_view host);

// The bare host of "HOST:PORT" ("[::1]:70" -> "::1"); InvalidArgument when
// there is no ":PORT".
absl::StatusOr<std::string> HostOfAddress(absl::string_view address);

// True when every address `host` stands for is a loopback address
// (127.0.0.0/8, ::1, "localhost"). False for a wildcard ("0.0.0.0", "::",
// ""), which listens on every interface, and for names that do not resolve.
bool IsLoopbackHost(absl::string_view host);

// The numeric addresses `host` (bare, numeric or a name) resolves to, in
// their canonical text form ("::ffff:1.2.3.4" as "1.2.3.4").
absl::StatusOr<std::vector<std::string>> ResolveHost(absl::string_view host);

// The IP of the other end of a gRPC call, from ServerContext::peer()
// ("ipv4:10.0.0.2:5000" -> "10.0.0.2", "ipv6:[::1]:5000" -> "::1"); empty
// for a peer that is not a TCP address (a unix socket).
std::string IpOfGrpcPeer(absl::string_view peer);

// gRPC's target for the unix socket at `path`, relative (to the working
// directory) or absolute: "unix:PATH". ("unix://" + a relative path would
// make its first component an authority.)
std::string UnixSocketTarget(absl::string_view path);

}  // namespace ckpt::io

#endif  // CKPT_IO_HOST_H_
