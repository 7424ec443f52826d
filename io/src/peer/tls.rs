//! Mutual TLS between cluster hosts. Every host presents a certificate
//! issued by the cluster's CA whose subject name is `skippr-node-<id>`; a
//! dialing host checks the accepting host's certificate for the id it
//! dialed, and an accepting host checks the dialing host's certificate for
//! the id its `Hello` claims. TLS 1.3 only, on the aws-lc-rs provider.
//! `skipprd cluster certs` (`generate`) makes a CA and one certificate per
//! node for a quick start.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The subject name node `node`'s certificate carries.
pub fn node_name(node: u64) -> String {
    format!("skippr-node-{node}")
}

/// The files a host's TLS needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster CA's certificate (PEM).
    pub ca: PathBuf,
    /// This host's certificate (PEM), issued by the CA for `skippr-node-<id>`.
    pub cert: PathBuf,
    /// This host's private key (PEM), readable by its owner only.
    pub key: PathBuf,
}

/// A host's TLS configurations, both ways.
#[derive(Clone)]
pub struct Tls {
    pub client: Arc<ClientConfig>,
    pub server: Arc<ServerConfig>,
}

impl Tls {
    /// Reads and checks the files: each readable, the key private to its
    /// owner, the certificate issued for this node's name. The error names
    /// the file and what to fix.
    pub fn load(files: &TlsFiles, node: u64) -> Result<Tls, String> {
        let read = |what: &str, path: &Path| {
            std::fs::read(path).map_err(|e| format!("cannot read the cluster's {what} {}: {e}", path.display()))
        };
        let mode = std::fs::metadata(&files.key)
            .map_err(|e| format!("cannot read the cluster's TLS key {}: {e}", files.key.display()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "the TLS key {} is readable by others (mode {:04o}): `chmod 600` it",
                files.key.display(),
                mode & 0o7777
            ));
        }
        let (ca, cert, key) =
            (read("CA certificate", &files.ca)?, read("TLS certificate", &files.cert)?, read("TLS key", &files.key)?);
        Tls::from_pem(&ca, &cert, &key, node).map_err(|e| {
            format!(
                "the cluster's TLS files ({}, {}, {}): {e}",
                files.ca.display(),
                files.cert.display(),
                files.key.display()
            )
        })
    }

    pub fn from_pem(ca: &[u8], cert: &[u8], key: &[u8], node: u64) -> Result<Tls, String> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let roots = roots_from_pem(ca)?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("the certificate file is not PEM certificates: {e}"))?;
        let Some(leaf) = chain.first() else { return Err("the certificate file holds no certificate".into()) };
        if !issued_for(leaf, node) {
            return Err(format!(
                "the certificate is not issued for node {node} (its name must be {}): is it another node's?",
                node_name(node)
            ));
        }
        let key =
            PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("the key file is not a PEM private key: {e}"))?;
        let roots = Arc::new(roots);
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
                .build()
                .map_err(|e| format!("the CA certificate cannot verify clients: {e}"))?;
        let server = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| format!("the certificate and key do not go together: {e}"))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("the certificate and key do not go together: {e}"))?;
        Ok(Tls { client: Arc::new(client), server: Arc::new(server) })
    }
}

/// The certificates of a CA file (PEM), as roots to verify peers against.
pub(crate) fn roots_from_pem(ca: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca) {
        roots
            .add(c.map_err(|e| format!("the CA file is not PEM certificates: {e}"))?)
            .map_err(|e| format!("the CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("the CA file holds no certificate".into());
    }
    Ok(roots)
}

/// The name a dialing host checks the accepting host's certificate for.
pub fn server_name(node: u64) -> ServerName<'static> {
    ServerName::try_from(node_name(node)).expect("a valid DNS name")
}

/// The certificate is issued for node `node`'s name (its chain to the CA
/// is rustls's to check, during the handshake).
pub fn issued_for(cert: &CertificateDer<'_>, node: u64) -> bool {
    let Ok(cert) = webpki::EndEntityCert::try_from(cert) else { return false };
    cert.verify_is_valid_for_subject_name(&server_name(node)).is_ok()
}

/// A CA and certificates for `nodes`, as PEM: (CA certificate, CA key,
/// per node (id, certificate, key)).
pub type Generated = (String, String, Vec<(u64, String, String)>);

/// Makes a new CA and one certificate per node, signed by it, each for the
/// node's name and for both TLS roles.
pub fn generate(nodes: &[u64]) -> Result<Generated, rcgen::Error> {
    let ca_key = rcgen::KeyPair::generate()?;
    let ca = ca_params()?;
    let ca_cert = ca.self_signed(&ca_key)?;
    let ca_pem = (ca_cert.pem(), ca_key.serialize_pem());
    let nodes = sign_nodes(&rcgen::Issuer::new(ca, ca_key), nodes)?;
    Ok((ca_pem.0, ca_pem.1, nodes))
}

/// A certificate and key per node, from a CA `generate` made (its
/// certificate and key as PEM): for a host that joins later. Each one is
/// checked to chain to that CA certificate, so a key that is not the CA's
/// is refused rather than written.
pub fn issue(ca_pem: &str, ca_key_pem: &str, nodes: &[u64]) -> Result<Vec<(u64, String, String)>, String> {
    let key = rcgen::KeyPair::from_pem(ca_key_pem).map_err(|e| format!("the CA key: {e}"))?;
    let issuer = rcgen::Issuer::new(ca_params().map_err(|e| e.to_string())?, key);
    let issued = sign_nodes(&issuer, nodes).map_err(|e| e.to_string())?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.map_err(|e| format!("the CA certificate: {e}"))?)
            .map_err(|e| format!("the CA certificate: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| format!("the CA certificate: {e}"))?;
    for (node, cert, _) in &issued {
        let der = CertificateDer::from_pem_slice(cert.as_bytes()).map_err(|e| e.to_string())?;
        let name = ServerName::try_from(node_name(*node)).map_err(|e| e.to_string())?;
        let now = rustls::pki_types::UnixTime::now();
        rustls::client::danger::ServerCertVerifier::verify_server_cert(&*verifier, &der, &[], &name, &[], now).map_err(|e| {
            format!("a certificate signed with this key does not chain to this CA certificate ({e}): are ca.pem and ca-key.pem a pair?")
        })?;
    }
    Ok(issued)
}

/// The cluster CA as `generate` makes it: its name is what issued
/// certificates name as their issuer.
fn ca_params() -> Result<rcgen::CertificateParams, rcgen::Error> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyUsagePurpose};
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, "skippr cluster CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    Ok(ca)
}

fn sign_nodes(
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    nodes: &[u64],
) -> Result<Vec<(u64, String, String)>, rcgen::Error> {
    use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose};
    let mut out = Vec::new();
    for &node in nodes {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![node_name(node)])?;
        params.distinguished_name.push(DnType::CommonName, node_name(node));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, issuer)?;
        out.push((node, cert.pem(), key.serialize_pem()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_certificates_load_only_for_their_own_node() {
        let (ca, _, nodes) = generate(&[1, 2]).unwrap();
        let (_, cert, key) = &nodes[0];
        assert!(Tls::from_pem(ca.as_bytes(), cert.as_bytes(), key.as_bytes(), 1).is_ok());
        let err = Tls::from_pem(ca.as_bytes(), cert.as_bytes(), key.as_bytes(), 2).err().unwrap();
        assert!(err.contains("not issued for node 2"), "{err}");
        let (_, _, other_key) = &nodes[1];
        let err = Tls::from_pem(ca.as_bytes(), cert.as_bytes(), other_key.as_bytes(), 1).err().unwrap();
        assert!(err.contains("do not go together"), "{err}");
        assert!(Tls::from_pem(b"", cert.as_bytes(), key.as_bytes(), 1).is_err(), "no CA");
        assert!(Tls::from_pem(ca.as_bytes(), b"junk", key.as_bytes(), 1).is_err(), "no certificate");
    }

    #[test]
    fn a_node_issued_later_by_the_same_ca_loads_and_another_cas_key_is_refused() {
        let (ca, ca_key, _) = generate(&[1]).unwrap();
        let issued = issue(&ca, &ca_key, &[4]).unwrap();
        let (node, cert, key) = &issued[0];
        assert_eq!(*node, 4);
        assert!(Tls::from_pem(ca.as_bytes(), cert.as_bytes(), key.as_bytes(), 4).is_ok());
        let (_, other_key, _) = generate(&[1]).unwrap();
        let err = issue(&ca, &other_key, &[4]).unwrap_err();
        assert!(err.contains("does not chain to this CA certificate"), "{err}");
    }

    #[test]
    fn a_key_readable_by_others_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let (ca, _, nodes) = generate(&[1]).unwrap();
        let files =
            TlsFiles { ca: tmp.path().join("ca.pem"), cert: tmp.path().join("c.pem"), key: tmp.path().join("k.pem") };
        std::fs::write(&files.ca, ca).unwrap();
        std::fs::write(&files.cert, &nodes[0].1).unwrap();
        std::fs::write(&files.key, &nodes[0].2).unwrap();
        std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Tls::load(&files, 1).err().unwrap();
        assert!(err.contains("readable by others (mode 0644)"), "{err}");
        std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Tls::load(&files, 1).is_ok());
        let missing = TlsFiles { ca: tmp.path().join("nope.pem"), ..files };
        assert!(Tls::load(&missing, 1).err().unwrap().contains("cannot read the cluster's CA certificate"));
    }
}
