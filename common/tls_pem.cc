#include "common/tls_pem.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/str_cat.h"

namespace muonshard {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

Bio MemoryBio(absl::string_view pem) { return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))); }

// The reason of OpenSSL's last error, and the queue emptied: it is
// thread-local and would otherwise leak into gRPC's own TLS error reports.
std::string TakeOpenSslError() {
  const unsigned long code = ERR_peek_last_error();
  const char* reason = code != 0 ? ERR_reason_error_string(code) : nullptr;
  ERR_clear_error();
  return reason != nullptr ? reason : "no PEM data";
}

absl::Status Invalid(absl::string_view what, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", problem));
}

// The first certificate of `pem`; nullptr when there is none.
Cert FirstCertificate(absl::string_view pem) {
  Bio bio = MemoryBio(pem);
  return Cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
}

// A passphrase callback that refuses: an encrypted key fails to load
// instead of OpenSSL prompting on the terminal.
int NoPassphrase(char*, int, int, void*) { return -1; }

Key PrivateKey(absl::string_view pem) {
  Bio bio = MemoryBio(pem);
  return Key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr);
}

}  // namespace

absl::Status CheckPemCertificates(absl::string_view pem, absl::string_view what) {
  Bio bio = MemoryBio(pem);
  if (!bio) return Invalid(what, "out of memory reading PEM");
  int count = 0;
  while (Cert cert{PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)}) ++count;
  // The loop ends at the end of the data (PEM_R_NO_START_LINE) or at a block
  // that is not a certificate; only the first is fine, and only after one.
  const unsigned long code = ERR_peek_last_error();
  const bool clean_end = ERR_GET_LIB(code) == ERR_LIB_PEM && ERR_GET_REASON(code) == PEM_R_NO_START_LINE;
  const std::string reason = TakeOpenSslError();
  if (count == 0) return Invalid(what, absl::StrCat("not a PEM certificate (", reason, ")"));
  if (!clean_end) {
    return Invalid(what,
                   absl::StrCat("PEM block after certificate ", count, " is not a valid certificate (", reason, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckPemPrivateKey(absl::string_view pem, absl::string_view what) {
  if (PrivateKey(pem)) return absl::OkStatus();
  return Invalid(what, absl::StrCat("not an unencrypted PEM private key (", TakeOpenSslError(), ")"));
}

absl::Status CheckPemKeyPair(absl::string_view cert_pem, absl::string_view cert_what, absl::string_view key_pem,
                             absl::string_view key_what) {
  if (absl::Status s = CheckPemCertificates(cert_pem, cert_what); !s.ok()) return s;
  if (absl::Status s = CheckPemPrivateKey(key_pem, key_what); !s.ok()) return s;
  Cert cert = FirstCertificate(cert_pem);
  Key key = PrivateKey(key_pem);
  const bool match = cert && key && X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (match) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key_what, " does not match the certificate in ", cert_what,
                                                 " (the key must be the one the certificate was issued for)"));
}

}  // namespace muonshard
