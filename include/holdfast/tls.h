// The control plane's TLS files (docs/security.md).
#ifndef HOLDFAST_INCLUDE_HOLDFAST_TLS_H_
#define HOLDFAST_INCLUDE_HOLDFAST_TLS_H_

#include <string>

namespace holdfast {

// PEM files: the job's certificate authority, and this process's
// certificate (signed by it) and private key. All three or none: none
// is plain TCP. Every process of a job presents its certificate and
// checks its peer's against the CA (mutual TLS).
struct TlsFiles {
  std::string ca, cert, key;
  // The name the controller's (or a host agent's) certificate must carry;
  // "": the host of the address dialled.
  std::string server_name;

  bool empty() const { return ca.empty() && cert.empty() && key.empty(); }
};

}  // namespace holdfast

#endif  // HOLDFAST_INCLUDE_HOLDFAST_TLS_H_
