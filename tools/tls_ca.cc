#include "tools/tls_ca.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace holdfast::run {
namespace {

template <typename T, void (*F)(T*)>
struct Free {
  void operator()(T* p) const { F(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Free<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Free<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Free<BIO, BIO_free_all>>;

absl::Status Failed(const std::string& step) {
  char buf[256] = {};
  ERR_error_string_n(ERR_get_error(), buf, sizeof(buf));
  return absl::InternalError(
      absl::StrCat("making the job's certificates: ", step, ": ", buf));
}

// Adds the extension `nid` with `value` (OpenSSL's config syntax).
absl::Status AddExt(X509* cert, X509* issuer, int nid,
                    const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return Failed(absl::StrCat("extension ", value));
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return ok == 1 ? absl::OkStatus() : Failed("X509_add_ext");
}

// A certificate for `key` named `cn`, valid from an hour ago for `days`,
// with a random serial; self-issued when `issuer` is null.
absl::StatusOr<Cert> NewCert(EVP_PKEY* key, const char* cn, X509* issuer,
                             int days) {
  Cert cert(X509_new());
  if (cert == nullptr || X509_set_version(cert.get(), 2) != 1) {
    return Failed("X509_new");
  }
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return Failed("RAND_bytes");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  const bool serial_ok =
      bn != nullptr &&
      BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(bn);
  if (!serial_ok) return Failed("serial number");
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), int64_t{days} * 86400);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn), -1, -1,
                             0);
  X509_set_issuer_name(
      cert.get(), issuer != nullptr ? X509_get_subject_name(issuer) : name);
  if (X509_set_pubkey(cert.get(), key) != 1) return Failed("X509_set_pubkey");
  return cert;
}

absl::StatusOr<std::string> Pem(X509* cert, EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  const int ok = cert != nullptr
                     ? PEM_write_bio_X509(bio.get(), cert)
                     : PEM_write_bio_PrivateKey(bio.get(), key, nullptr,
                                                nullptr, 0, nullptr, nullptr);
  if (ok != 1) return Failed("PEM_write");
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  }
  const ssize_t n = write(fd, text.data(), text.size());
  close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  }
  return absl::OkStatus();
}

// "IP:a" for an address, else "DNS:a".
std::string AltName(const std::string& name) {
  unsigned char buf[sizeof(in6_addr)];
  const bool ip = inet_pton(AF_INET, name.c_str(), buf) == 1 ||
                  inet_pton(AF_INET6, name.c_str(), buf) == 1;
  return absl::StrCat(ip ? "IP:" : "DNS:", name);
}

}  // namespace

absl::StatusOr<TlsFiles> MakeJobCertificates(
    const std::string& dir, const std::vector<std::string>& names, int days) {
  Key ca_key(EVP_EC_gen("P-256"));
  Key key(EVP_EC_gen("P-256"));
  if (ca_key == nullptr || key == nullptr) return Failed("EVP_EC_gen");
  absl::StatusOr<Cert> ca =
      NewCert(ca_key.get(), "holdfast job CA", nullptr, days);
  if (!ca.ok()) return ca.status();
  X509* c = ca->get();
  for (const auto& [nid, value] :
       {std::pair{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
        std::pair{NID_key_usage, "critical,keyCertSign,cRLSign"},
        std::pair{NID_subject_key_identifier, "hash"}}) {
    if (absl::Status s = AddExt(c, c, nid, value); !s.ok()) return s;
  }
  if (X509_sign(c, ca_key.get(), EVP_sha256()) == 0) return Failed("sign CA");

  absl::StatusOr<Cert> leaf =
      NewCert(key.get(), "holdfast job member", c, days);
  if (!leaf.ok()) return leaf.status();
  X509* l = leaf->get();
  std::string alt = "IP:127.0.0.1,IP:::1,DNS:localhost";
  for (const std::string& n : names) absl::StrAppend(&alt, ",", AltName(n));
  for (const auto& [nid, value] :
       {std::pair{NID_basic_constraints, std::string("critical,CA:FALSE")},
        std::pair{NID_key_usage,
                  std::string("critical,digitalSignature,keyAgreement")},
        std::pair{NID_ext_key_usage, std::string("serverAuth,clientAuth")},
        std::pair{NID_subject_alt_name, alt},
        std::pair{NID_authority_key_identifier, std::string("keyid")}}) {
    if (absl::Status s = AddExt(l, c, nid, value); !s.ok()) return s;
  }
  if (X509_sign(l, ca_key.get(), EVP_sha256()) == 0) {
    return Failed("sign the certificate");
  }

  TlsFiles files;
  files.ca = dir + "/ca.pem";
  files.cert = dir + "/cert.pem";
  files.key = dir + "/key.pem";
  for (const auto& [path, cert, k] :
       {std::tuple{files.ca, c, static_cast<EVP_PKEY*>(nullptr)},
        std::tuple{files.cert, l, static_cast<EVP_PKEY*>(nullptr)},
        std::tuple{files.key, static_cast<X509*>(nullptr), key.get()}}) {
    absl::StatusOr<std::string> pem = Pem(cert, k);
    if (!pem.ok()) return pem.status();
    if (absl::Status s = WriteFile(path, *pem); !s.ok()) return s;
  }
  return files;
}

}  // namespace holdfast::run
