#ifndef MUONSHARD_COMMON_TLS_PEM_H_
#define MUONSHARD_COMMON_TLS_PEM_H_

// Checks TLS material (PEM) before it reaches gRPC. gRPC reports an
// unreadable certificate, or a key that does not belong to the certificate,
// only as "cannot listen" on the server and "empty address list" on a
// client; these checks name the file instead. Each `what` names where the
// PEM came from, e.g. "flag --tls-cert (/etc/muonshard/server.crt)".
// Errors are INVALID_ARGUMENT: the files are the user's input.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace muonshard {

// At least one X.509 certificate, every PEM block of `pem` a certificate.
absl::Status CheckPemCertificates(absl::string_view pem, absl::string_view what);

// A private key (not encrypted: nobody could type its passphrase).
absl::Status CheckPemPrivateKey(absl::string_view pem, absl::string_view what);

// Both parse, and the key is the one of the first (leaf) certificate.
absl::Status CheckPemKeyPair(absl::string_view cert_pem, absl::string_view cert_what, absl::string_view key_pem,
                             absl::string_view key_what);

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_TLS_PEM_H_
