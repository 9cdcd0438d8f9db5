//! A throw-away PKI for the TLS tests, made at test time (no private key is ever committed): a
//! CA, a server certificate for 127.0.0.1 and localhost, and a client certificate, written as
//! PEM files; and a TLS client that trusts that CA.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The files of a test PKI.
pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub ca_der: CertificateDer<'static>,
}

/// A CA named `name` and its server and client certificates, in `dir` (`name-*.pem`).
pub fn pki(dir: &Path, name: &str) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, format!("dxdp test CA {name}"));
    let ca = CertifiedIssuer::self_signed(params, ca_key).unwrap();

    let server_key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("dxdp test server {name}"));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server = params.signed_by(&server_key, &ca).unwrap();

    let client_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "prometheus");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client = params.signed_by(&client_key, &ca).unwrap();

    let write = |file: &str, text: String| {
        let p = dir.join(format!("{name}-{file}"));
        std::fs::write(&p, text).unwrap();
        p
    };
    Pki {
        ca: write("ca.pem", ca.pem()),
        server_cert: write("server.pem", server.pem()),
        server_key: write("server-key.pem", server_key.serialize_pem()),
        client_cert: write("client.pem", client.pem()),
        client_key: write("client-key.pem", client_key.serialize_pem()),
        ca_der: ca.der().clone(),
    }
}

/// A TLS client trusting `ca`, with the client certificate of `pki` when `with_cert`.
pub fn client(pki: &Pki, with_cert: bool) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = if with_cert {
        use rustls_pki_types::pem::PemObject;
        let certs = CertificateDer::pem_file_iter(&pki.client_cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&pki.client_key).unwrap();
        builder.with_client_auth_cert(certs, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// The subject CN of the server's certificate and one HTTP/1.1 exchange over TLS:
/// `Err` when the handshake or the request fails.
pub async fn https_get(
    connector: &tokio_rustls::TlsConnector,
    address: SocketAddr,
    path: &str,
    authorization: Option<&str>,
) -> Result<(Vec<u8>, String), String> {
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").unwrap().to_owned();
    let mut tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let peer = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .unwrap_or_default();
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: dxdp\r\n{auth}Connection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut raw))
        .await
        .map_err(|_| "answer timed out".to_string())?
        .map_err(|e| e.to_string())?;
    if raw.is_empty() {
        return Err("no answer".into());
    }
    Ok((peer, String::from_utf8_lossy(&raw).into_owned()))
}
