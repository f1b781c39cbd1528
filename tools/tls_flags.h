// The control plane's TLS flags, shared by holdfast-run, holdfast-controller,
// holdfast-agent and holdfast (docs/security.md).
#ifndef HOLDFAST_TOOLS_TLS_FLAGS_H_
#define HOLDFAST_TOOLS_TLS_FLAGS_H_

#include <CLI/CLI.hpp>

#include "holdfast/tls.h"
#include "src/control/wire/tls.h"

namespace holdfast::tools {

// --tls-ca, --tls-cert, --tls-key and --tls-server-name into `files`,
// which start as HOLDFAST_TLS_CA, _CERT, _KEY and _SERVER_NAME.
inline void AddTlsFlags(CLI::App& app, TlsFiles* files) {
  *files = control::TlsFilesFromEnv();
  app.add_option("--tls-ca", files->ca,
                 "the job's CA, PEM (default: HOLDFAST_TLS_CA); with "
                 "--tls-cert and --tls-key, mutual TLS on the control plane");
  app.add_option("--tls-cert", files->cert,
                 "this process's certificate, PEM (default: "
                 "HOLDFAST_TLS_CERT)");
  app.add_option("--tls-key", files->key,
                 "this process's private key, PEM (default: "
                 "HOLDFAST_TLS_KEY)");
  app.add_option("--tls-server-name", files->server_name,
                 "the name the server's certificate carries, when not the "
                 "host dialled (default: HOLDFAST_TLS_SERVER_NAME)");
}

}  // namespace holdfast::tools

#endif  // HOLDFAST_TOOLS_TLS_FLAGS_H_
