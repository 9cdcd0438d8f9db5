//! `client_allowed_sans` of the web configuration over real TLS (issue 44): a client certificate
//! that the CA signed is let in only when it names one of the allowed names; certificates are
//! made at test time.

use std::sync::Arc;

use dxdp::observe::access::Access;
use dxdp::observe::http;
use dxdp::observe::web::Web;
use dxdp::observe::Observe;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    SanType,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::tls;

/// A TLS client trusting `ca` that shows `cert` (signed by the CA) with `key`.
fn client_with(
    ca: &CertificateDer<'static>,
    cert: CertificateDer<'static>,
    key: &KeyPair,
) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![cert],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

#[tokio::test]
async fn only_client_certificates_naming_an_allowed_san_get_in() {
    let dir = tempfile::tempdir().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server = params.signed_by(&server_key, &ca).unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.path().join("server.pem"), server.pem()).unwrap();
    std::fs::write(
        dir.path().join("server-key.pem"),
        server_key.serialize_pem(),
    )
    .unwrap();
    let client = |sans: Vec<SanType>| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &ca).unwrap();
        client_with(ca.der(), cert.der().clone(), &key)
    };
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server-key.pem\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n  client_allowed_sans:\n    - prometheus.monitoring.svc\n    - spiffe://cluster.local/ns/monitoring/sa/prometheus\n",
    )
    .unwrap();
    let observe = Observe::new();
    let server = http::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
        .with_access(Access {
            web: Some(Arc::new(Web::load(&web, |_| {}).unwrap())),
            ..Access::default()
        });
    let address = server.local_addr();
    let task = tokio::spawn(server.serve(observe));

    let allowed = [
        vec![SanType::DnsName(
            "prometheus.monitoring.svc".try_into().unwrap(),
        )],
        vec![
            SanType::DnsName("other.example".try_into().unwrap()),
            SanType::URI(
                "spiffe://cluster.local/ns/monitoring/sa/prometheus"
                    .try_into()
                    .unwrap(),
            ),
        ],
    ];
    for sans in allowed {
        let (_, answer) = tls::https_get(&client(sans), address, "/metrics", None)
            .await
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    }
    let refused = [
        vec![],
        vec![SanType::DnsName(
            "grafana.monitoring.svc".try_into().unwrap(),
        )],
        // Exact names only: no wildcard or suffix match.
        vec![SanType::DnsName(
            "x.prometheus.monitoring.svc".try_into().unwrap(),
        )],
    ];
    for sans in refused {
        let got = tls::https_get(&client(sans.clone()), address, "/metrics", None).await;
        assert!(got.is_err(), "{sans:?}: {got:?}");
    }
    task.abort();
}
