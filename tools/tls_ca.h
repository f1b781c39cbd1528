// A private certificate authority for one job (holdfast-run on one
// machine): a CA and one certificate it signs, which every process of the
// job presents, as server and as client. The CA's key is never written:
// nothing else can be signed by it once the job's files exist.
#ifndef HOLDFAST_TOOLS_TLS_CA_H_
#define HOLDFAST_TOOLS_TLS_CA_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "holdfast/tls.h"

namespace holdfast::run {

// Writes ca.pem, cert.pem and key.pem (mode 0600) into `dir`, which must
// exist and should be private (0700). The certificate names 127.0.0.1,
// ::1, localhost and each of `names` (IP addresses or DNS names); ECDSA
// P-256, valid from an hour ago for `days`. Internal error naming the
// OpenSSL step that failed.
absl::StatusOr<TlsFiles> MakeJobCertificates(
    const std::string& dir, const std::vector<std::string>& names,
    int days = 30);

}  // namespace holdfast::run

#endif  // HOLDFAST_TOOLS_TLS_CA_H_
