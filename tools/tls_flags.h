// The control plane's TLS flags, shared by holdfast-run, holdfast-controller,
// holdfast-agent and holdfast (docs/security.md).
#ifndef HOLDFAST_TOOLS_TLS_FLAGS_H_
#define HOLDFAST_TOOLS_TLS_FLAGS_H_

#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>
#include <string>

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

// Loads `files` into `tls` (nullopt: none given); on an error prints it
// after `tool` and returns false (the tool exits 2).
inline bool LoadTlsFlags(const char* tool, const TlsFiles& files,
                         std::optional<control::TlsConfig>* tls) {
  absl::StatusOr<std::optional<control::TlsConfig>> loaded =
      control::LoadTls(files);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s: %s\n", tool,
                 std::string(loaded.status().message()).c_str());
    return false;
  }
  *tls = *std::move(loaded);
  return true;
}

}  // namespace holdfast::tools

#endif  // HOLDFAST_TOOLS_TLS_FLAGS_H_
