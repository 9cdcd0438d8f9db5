//! The web configuration of the metrics listener (`metrics.webConfigFile`): the file format the
//! Prometheus exporters share (exporter-toolkit's `web-config.yml`): `tls_server_config` (TLS
//! with rustls, optional client certificates), `basic_auth_users` (bcrypt hashes) and
//! `http_server_config.headers`.
//!
//! [`WebConfig::load`] reads and checks the file and every file it names; an invalid one is an
//! error naming the file and the key ([`WebConfigError`]). [`Web`] holds the configuration in
//! force and, before a connection is served, at most once per `RECHECK`, looks whether the
//! web configuration file or a file it names changed (size, modification time, identity): a
//! changed set is loaded again, so a rotated certificate (cert-manager writes the Secret, the
//! kubelet swaps the volume's files) is used from the next connection on, without a restart. A
//! change that does not load keeps the last good configuration: it is logged once per distinct
//! error, naming the file and key, and counted (`dxdp_web_config_reloads_total{result="rejected"}`).
//! The metrics endpoint therefore never falls back to plain HTTP or to no authentication: an
//! empty file is an error, and a reload that would drop TLS, weaken client-certificate
//! verification, drop `client_allowed_sans` or drop `basic_auth_users` is rejected the same way
//! until dxdp restarts.
//!
//! Basic authentication never hashes on the async workers or tokio's blocking pool: headers
//! over `MAX_AUTHORIZATION` bytes and passwords over `MAX_PASSWORD` bytes are refused first,
//! outcomes are remembered, and bcrypt runs on the bounded verifier (`observe::verifier`).
//! `rate_limit` (a token bucket over every request but the probes, as in the exporters)
//! answers `429` past its burst.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use http::header::{HeaderName, HeaderValue};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
    SupportedCipherSuite, SupportedProtocolVersion,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use serde::Deserialize;

use super::verifier::{Busy, Remembered, Verifier};
use crate::util::bounded::run_blocking;
use crate::util::stable_read::{self, Stamp};
use crate::util::{host_acl, host_process};

/// How often, at most, the files are looked at again for a change.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// The largest web configuration, certificate, key or CA file read.
pub(crate) const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// How long a reload (reading a handful of small files) may take before the connection is
/// served with the configuration in force.
pub(crate) const RELOAD_LIMIT: Duration = Duration::from_secs(5);

/// The longest `Authorization` header looked at; a longer one is refused unread.
pub(crate) const MAX_AUTHORIZATION: usize = 4096;

/// The longest password checked: bcrypt reads 72 bytes, a longer one is refused unhashed.
pub(crate) const MAX_PASSWORD: usize = 72;

/// The highest bcrypt cost accepted (each further step doubles every check's time).
pub(crate) const MAX_COST: u32 = 12;

/// The headers `http_server_config.headers` may set (as the exporters allow).
pub(crate) const ALLOWED_HEADERS: [&str; 5] = [
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
    "Content-Security-Policy",
];

/// Why a web configuration cannot be used: the file, the key, what is wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("web configuration {}: {key}: {message}", file.display())]
pub struct WebConfigError {
    /// The web configuration file.
    pub(crate) file: PathBuf,
    /// The key (`tls_server_config.cert_file`), or where in the file (`line 3 column 5`).
    pub key: String,
    /// What is wrong.
    pub(crate) message: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebConfigFile {
    #[serde(default)]
    tls_server_config: Option<TlsFile>,
    #[serde(default)]
    http_server_config: Option<HttpFile>,
    #[serde(default)]
    basic_auth_users: Option<BTreeMap<String, String>>,
    #[serde(default)]
    rate_limit: Option<RateLimitFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitFile {
    interval: Option<String>,
    burst: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<String>,
    key_file: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<String>,
    client_allowed_sans: Option<Vec<String>>,
    min_version: Option<String>,
    max_version: Option<String>,
    cipher_suites: Option<Vec<String>>,
    prefer_server_cipher_suites: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    http2: Option<bool>,
    headers: Option<BTreeMap<String, String>>,
}

/// Whether and how clients show certificates (`client_auth_type`), weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ClientAuth {
    /// `NoClientCert` (the default): none asked for.
    None,
    /// `VerifyClientCertIfGiven`: a certificate is optional, and verified when given.
    VerifyIfGiven,
    /// `RequireAndVerifyClientCert`: a certificate signed by `client_ca_file` is required.
    Require,
}

/// One loaded web configuration.
pub struct WebConfig {
    tls: Option<Arc<ServerConfig>>,
    client_auth: ClientAuth,
    allowed_sans: Vec<String>,
    users: BTreeMap<String, Arc<str>>,
    /// Checked for an unknown user: a hash of a random password at the users' highest cost.
    dummy: Option<Arc<str>>,
    headers: Vec<(HeaderName, HeaderValue)>,
    rate_limit: Option<RateLimit>,
    /// The files it was loaded from, with their stamps when loaded.
    files: Vec<(PathBuf, Option<Stamp>)>,
    /// Outcomes of earlier checks.
    remembered: Remembered,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("client_auth", &self.client_auth)
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .field("headers", &self.headers)
            .field("allowed_sans", &self.allowed_sans)
            .field("rate_limit", &self.rate_limit)
            .finish_non_exhaustive()
    }
}

/// What the basic authentication of one request says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BasicAuth {
    /// No `basic_auth_users`: not asked for.
    NotConfigured,
    /// The user and password match.
    Passed,
    /// Missing, malformed, too long, unknown user or wrong password.
    Failed,
    /// Not checked: the verifier's queue is full.
    Busy,
}

impl WebConfig {
    /// Reads and checks `path` and every file it names (relative paths are relative to the
    /// directory of `path`, as in the exporters).
    pub fn load(path: &Path) -> Result<WebConfig, WebConfigError> {
        Self::load_in(path, None)
    }

    /// [`WebConfig::load`] in a HostProcess container whose sandbox mount point is `sandbox`:
    /// a file named by an absolute path is read from the pod's volume under the sandbox when it
    /// is there (`crate::util::host_process`), and every file must be owned by SYSTEM,
    /// Administrators or dxdp's account (`crate::util::host_acl`; Windows).
    pub(crate) fn load_in(path: &Path, sandbox: Option<&str>) -> Result<WebConfig, WebConfigError> {
        let err = |key: &str, message: String| WebConfigError {
            file: path.to_path_buf(),
            key: key.to_string(),
            message,
        };
        let mut files = vec![(path.to_path_buf(), Stamp::of(path).ok())];
        let text = stable_read::read_once(path, MAX_FILE_BYTES)
            .map_err(|e| err("(file)", format!("cannot read it: {e}")))?;
        host_acl::check_owner(path).map_err(|e| err("(file)", e.to_string()))?;
        let parsed: WebConfigFile = if text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            return Err(err(
                "(file)",
                "the file is empty: a web configuration sets tls_server_config, basic_auth_users or both (dxdp never reads an empty one as \"no TLS, no users\"); write them, or unset metrics.webConfigFile to serve /metrics without them".into(),
            ));
        } else {
            let options = serde_saphyr::options! { with_snippet: false };
            serde_saphyr::from_str_with_options(&text, options).map_err(|e| {
                let at = e
                    .location()
                    .map(|l| format!("line {} column {}", l.line(), l.column()))
                    .unwrap_or_else(|| "(file)".into());
                err(&at, dxdp_core::snapshot::yaml_message(&e).to_string())
            })?
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: &str| {
            let p = Path::new(p);
            if p.is_absolute() {
                host_process::resolve(p, sandbox, |p| p.exists())
            } else {
                dir.join(p)
            }
        };
        let mut read_file = |key: &str, name: &str| -> Result<String, WebConfigError> {
            let p = resolve(name);
            files.push((p.clone(), Stamp::of(&p).ok()));
            let text = stable_read::read_once(&p, MAX_FILE_BYTES)
                .map_err(|e| err(key, format!("cannot read {}: {e}", p.display())))?;
            host_acl::check_owner(&p).map_err(|e| err(key, e.to_string()))?;
            Ok(text)
        };

        let mut client_auth = ClientAuth::None;
        let mut allowed_sans = Vec::new();
        let tls = match parsed.tls_server_config {
            None => None,
            Some(t) => {
                let cert_name = t.cert_file.filter(|s| !s.is_empty()).ok_or_else(|| {
                    err(
                        "tls_server_config.cert_file",
                        "missing: TLS needs a certificate file (PEM) and key_file".into(),
                    )
                })?;
                let key_name = t.key_file.filter(|s| !s.is_empty()).ok_or_else(|| {
                    err(
                        "tls_server_config.key_file",
                        "missing: TLS needs a private key file (PEM) and cert_file".into(),
                    )
                })?;
                let cert_pem = read_file("tls_server_config.cert_file", &cert_name)?;
                let certs: Vec<CertificateDer<'static>> =
                    CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                        .collect::<Result<_, _>>()
                        .map_err(|e| {
                            err(
                                "tls_server_config.cert_file",
                                format!("not a PEM certificate: {e}"),
                            )
                        })?;
                if certs.is_empty() {
                    return Err(err(
                        "tls_server_config.cert_file",
                        format!("{cert_name} holds no PEM certificate (BEGIN CERTIFICATE)"),
                    ));
                }
                let key_pem = read_file("tls_server_config.key_file", &key_name)?;
                let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| {
                    err(
                        "tls_server_config.key_file",
                        format!("{key_name} holds no usable PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
                    )
                })?;
                client_auth = match t.client_auth_type.as_deref().unwrap_or("NoClientCert") {
                    "" | "NoClientCert" => ClientAuth::None,
                    "VerifyClientCertIfGiven" => ClientAuth::VerifyIfGiven,
                    "RequireAndVerifyClientCert" => ClientAuth::Require,
                    other @ ("RequestClientCert" | "RequireAnyClientCert") => {
                        return Err(err(
                            "tls_server_config.client_auth_type",
                            format!("{other} accepts a client certificate without verifying it, which dxdp does not offer: use RequireAndVerifyClientCert (or VerifyClientCertIfGiven) with client_ca_file"),
                        ))
                    }
                    other => {
                        return Err(err(
                            "tls_server_config.client_auth_type",
                            format!("unknown value {other:?}: use NoClientCert, VerifyClientCertIfGiven or RequireAndVerifyClientCert"),
                        ))
                    }
                };
                allowed_sans = t.client_allowed_sans.unwrap_or_default();
                if !allowed_sans.is_empty() && client_auth != ClientAuth::Require {
                    return Err(err(
                        "tls_server_config.client_allowed_sans",
                        "needs client_auth_type: RequireAndVerifyClientCert (otherwise a client may connect without a certificate, leaving no name to match)".into(),
                    ));
                }
                if let Some(i) = allowed_sans.iter().position(|s| s.trim().is_empty()) {
                    return Err(err(
                        &format!("tls_server_config.client_allowed_sans[{i}]"),
                        "empty: name a DNS name, e-mail address, IP address or URI of the client certificates to let in".into(),
                    ));
                }
                let ca = match t.client_ca_file.filter(|s| !s.is_empty()) {
                    None if client_auth != ClientAuth::None => {
                        return Err(err(
                            "tls_server_config.client_ca_file",
                            "missing: client_auth_type verifies client certificates against the CAs of this file (PEM)".into(),
                        ))
                    }
                    None => None,
                    Some(name) => {
                        let pem = read_file("tls_server_config.client_ca_file", &name)?;
                        let mut roots = RootCertStore::empty();
                        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                            let cert = cert.map_err(|e| {
                                err(
                                    "tls_server_config.client_ca_file",
                                    format!("not a PEM certificate: {e}"),
                                )
                            })?;
                            roots.add(cert).map_err(|e| {
                                err(
                                    "tls_server_config.client_ca_file",
                                    format!("not a usable CA certificate: {e}"),
                                )
                            })?;
                        }
                        if roots.is_empty() {
                            return Err(err(
                                "tls_server_config.client_ca_file",
                                format!("{name} holds no PEM certificate (BEGIN CERTIFICATE)"),
                            ));
                        }
                        Some(roots)
                    }
                };
                let min = version(
                    t.min_version.as_deref(),
                    "tls_server_config.min_version",
                    &err,
                )?
                .unwrap_or(&rustls::version::TLS12);
                let max = version(
                    t.max_version.as_deref(),
                    "tls_server_config.max_version",
                    &err,
                )?
                .unwrap_or(&rustls::version::TLS13);
                let versions: Vec<&'static SupportedProtocolVersion> =
                    [&rustls::version::TLS12, &rustls::version::TLS13]
                        .into_iter()
                        .filter(|v| rank(v) >= rank(min) && rank(v) <= rank(max))
                        .collect();
                if versions.is_empty() {
                    return Err(err(
                        "tls_server_config.max_version",
                        "below min_version: no TLS version is left".into(),
                    ));
                }
                let mut provider = rustls::crypto::ring::default_provider();
                if let Some(names) = t.cipher_suites.filter(|n| !n.is_empty()) {
                    provider.cipher_suites = cipher_suites(&names, &err)?;
                }
                let provider = Arc::new(provider);
                let builder = ServerConfig::builder_with_provider(provider.clone())
                    .with_protocol_versions(&versions)
                    .map_err(|e| err("tls_server_config.cipher_suites", format!("{e}: with TLS 1.2 allowed, name at least one TLS 1.2 suite of this key's type")))?;
                let builder = match (client_auth, ca) {
                    (ClientAuth::None, _) => builder.with_no_client_auth(),
                    (mode, Some(roots)) => {
                        let verifier =
                            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                        let verifier = if mode == ClientAuth::VerifyIfGiven {
                            verifier.allow_unauthenticated()
                        } else {
                            verifier
                        };
                        let verifier = verifier
                            .build()
                            .map_err(|e| err("tls_server_config.client_ca_file", e.to_string()))?;
                        if allowed_sans.is_empty() {
                            builder.with_client_cert_verifier(verifier)
                        } else {
                            builder.with_client_cert_verifier(Arc::new(AllowedSans {
                                inner: verifier,
                                allowed: allowed_sans.clone(),
                            }))
                        }
                    }
                    (_, None) => unreachable_ca(&err)?,
                };
                let mut config = builder.with_single_cert(certs, key).map_err(|e| {
                    err(
                        "tls_server_config.key_file",
                        format!("does not go with cert_file {cert_name}: {e}"),
                    )
                })?;
                config.alpn_protocols = vec![b"http/1.1".to_vec()];
                config.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(false);
                Some(Arc::new(config))
            }
        };

        let mut users = BTreeMap::new();
        let mut highest = 0;
        for (user, hash) in parsed.basic_auth_users.unwrap_or_default() {
            let key = format!("basic_auth_users.{user}");
            if user.is_empty() || user.contains(':') {
                return Err(err(
                    &key,
                    "a user name must be non-empty and hold no ':'".into(),
                ));
            }
            let Ok(parts) = hash.parse::<bcrypt::HashParts>() else {
                return Err(err(
                    &key,
                    "not a bcrypt hash ($2a$, $2b$ or $2y$, 60 characters): make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'` and write the hash, never the password".into(),
                ));
            };
            let cost = parts.get_cost();
            if cost > MAX_COST {
                return Err(err(
                    &key,
                    format!("bcrypt cost {cost} is above {MAX_COST}, the highest dxdp accepts (every check of an unremembered password would cost {}x a cost-10 hash of CPU): make the hash again with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`", 1u64 << (cost - 10)),
                ));
            }
            highest = highest.max(cost);
            users.insert(user, Arc::<str>::from(hash));
        }
        let dummy = if users.is_empty() {
            None
        } else {
            Some(dummy_hash(highest).map_err(|e| err("basic_auth_users", e))?)
        };
        let rate_limit = match parsed.rate_limit {
            None => None,
            Some(r) => {
                let interval = match r.interval.as_deref() {
                    None | Some("") => Duration::ZERO,
                    Some(text) => go_duration(text).ok_or_else(|| {
                        err(
                            "rate_limit.interval",
                            format!(
                                "{text:?} is not a duration: write e.g. 1s, 250ms or 0 (no limit)"
                            ),
                        )
                    })?,
                };
                let burst = r.burst.unwrap_or(0);
                if interval.is_zero() {
                    None
                } else if burst == 0 {
                    return Err(err(
                        "rate_limit.burst",
                        "0 with an interval lets no request through: set it to 1 or more (the requests allowed at once)".into(),
                    ));
                } else {
                    Some(RateLimit::new(interval, burst))
                }
            }
        };

        let mut headers = Vec::new();
        let http = parsed.http_server_config.unwrap_or_default();
        if http.http2 == Some(true) {
            tracing::debug!(
                "web configuration {}: http_server_config.http2 is ignored: dxdp serves HTTP/1.1",
                path.display()
            );
        }
        for (name, value) in http.headers.unwrap_or_default() {
            let key = format!("http_server_config.headers.{name}");
            let Some(allowed) = ALLOWED_HEADERS
                .iter()
                .find(|a| a.eq_ignore_ascii_case(&name))
            else {
                return Err(err(
                    &key,
                    format!(
                        "this header cannot be set: the headers allowed are {}",
                        ALLOWED_HEADERS.join(", ")
                    ),
                ));
            };
            let value = HeaderValue::from_str(&value)
                .map_err(|_| err(&key, "not a valid header value".into()))?;
            headers.push((HeaderName::from_static(lower(allowed)), value));
        }
        Ok(WebConfig {
            tls,
            client_auth,
            allowed_sans,
            users,
            dummy,
            headers,
            rate_limit,
            files,
            remembered: Remembered::default(),
        })
    }

    /// The TLS configuration (`None`: plain HTTP).
    pub fn tls(&self) -> Option<Arc<ServerConfig>> {
        self.tls.clone()
    }

    /// Whether client certificates are verified.
    pub(crate) fn client_auth(&self) -> ClientAuth {
        self.client_auth
    }

    /// Whether `basic_auth_users` is set.
    pub(crate) fn has_users(&self) -> bool {
        !self.users.is_empty()
    }

    /// The headers added to every answer.
    pub(crate) fn headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.headers
    }

    /// Whether `rate_limit` lets one more request through now (always without one).
    pub(crate) fn rate_allows(&self) -> bool {
        self.rate_limit.as_ref().is_none_or(RateLimit::allow)
    }

    /// Checks an `Authorization` header value against `basic_auth_users`: refuses oversized
    /// headers and passwords at once, answers remembered pairs without hashing, and otherwise
    /// waits for `verifier` ([`BasicAuth::Busy`] when its queue is full).
    pub(crate) async fn check_basic(
        &self,
        authorization: Option<&[u8]>,
        verifier: &Verifier,
    ) -> BasicAuth {
        if self.users.is_empty() {
            return BasicAuth::NotConfigured;
        }
        let Some((user, password)) = authorization
            .filter(|v| v.len() <= MAX_AUTHORIZATION)
            .and_then(parse_basic)
        else {
            return BasicAuth::Failed;
        };
        if password.len() > MAX_PASSWORD {
            return BasicAuth::Failed;
        }
        let known = self.users.get(&user);
        // An unknown user is checked against a dummy hash at the users' highest cost: it takes
        // as long as a wrong password, and can never pass.
        let Some(hash) = known.or(self.dummy.as_ref()).cloned() else {
            return BasicAuth::Failed;
        };
        let digest = digest(&user, &password, &hash);
        let passed = match self.remembered.outcome(&digest) {
            Some(passed) => passed,
            None => match verifier.verify(password.as_bytes(), hash).await {
                Ok(passed) => {
                    self.remembered.remember(digest, passed);
                    passed
                }
                Err(Busy) => return BasicAuth::Busy,
            },
        };
        if passed && known.is_some() {
            BasicAuth::Passed
        } else {
            BasicAuth::Failed
        }
    }

    /// What a reload from `self` to `next` would weaken, if anything.
    fn weakened_by(&self, next: &WebConfig) -> Option<&'static str> {
        if self.tls.is_some() && next.tls.is_none() {
            Some("drop TLS (plain HTTP)")
        } else if next.client_auth < self.client_auth {
            Some("weaken client certificate verification (client_auth_type)")
        } else if !self.allowed_sans.is_empty() && next.allowed_sans.is_empty() {
            Some("drop client_allowed_sans")
        } else if self.has_users() && !next.has_users() {
            Some("drop basic_auth_users (no authentication)")
        } else {
            None
        }
    }

    fn changed(&self) -> bool {
        self.files
            .iter()
            .any(|(path, stamp)| Stamp::of(path).ok() != *stamp)
    }
}

/// The cache key of a check: SHA-256 of the user, the password and the hash, each with its
/// length.
fn digest(user: &str, password: &str, hash: &str) -> [u8; 32] {
    let mut d = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [user.as_bytes(), password.as_bytes(), hash.as_bytes()] {
        d.update(&(part.len() as u64).to_le_bytes());
        d.update(part);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(d.finish().as_ref());
    out
}

/// A bcrypt hash at `cost` of a random password nobody knows, made once per cost.
fn dummy_hash(cost: u32) -> Result<Arc<str>, String> {
    static MADE: Mutex<BTreeMap<u32, Arc<str>>> = Mutex::new(BTreeMap::new());
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(hash) = made.get(&cost) {
        return Ok(hash.clone());
    }
    let mut password = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut password)
        .map_err(|_| "the system's random number generator failed: try again".to_string())?;
    let hash: Arc<str> = bcrypt::hash(password, cost)
        .map_err(|e| format!("cannot make a bcrypt hash at cost {cost}: {e}"))?
        .into();
    made.insert(cost, hash.clone());
    Ok(hash)
}

/// A Go duration (`1s`, `250ms`, `1m30s`, `0`), as the exporters write `rate_limit.interval`.
fn go_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    match text {
        "0" => return Some(Duration::ZERO),
        "" => return None,
        _ => {}
    }
    let mut rest = text;
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&n| n > 0)?;
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).ok()
}

/// `rate_limit`: a token bucket of `burst` requests, one more every `interval`.
#[derive(Debug)]
struct RateLimit {
    interval: Duration,
    burst: u32,
    /// The tokens left and when they were counted.
    bucket: Mutex<(f64, Instant)>,
}

impl RateLimit {
    fn new(interval: Duration, burst: u32) -> Self {
        RateLimit {
            interval,
            burst,
            bucket: Mutex::new((f64::from(burst), Instant::now())),
        }
    }

    fn allow(&self) -> bool {
        let mut bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let earned = now.duration_since(bucket.1).as_secs_f64() / self.interval.as_secs_f64();
        *bucket = ((bucket.0 + earned).min(f64::from(self.burst)), now);
        if bucket.0 >= 1.0 {
            bucket.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

/// `client_allowed_sans`: a verified client certificate must also name one of `allowed` as a
/// subject alternative name (DNS name, e-mail address, IP address or URI, compared exactly, as
/// the exporters do); otherwise the handshake fails.
#[derive(Debug)]
struct AllowedSans {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: Vec<String>,
}

impl ClientCertVerifier for AllowedSans {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if subject_alt_names(end_entity)
            .iter()
            .any(|name| self.allowed.contains(name))
        {
            Ok(verified)
        } else {
            tracing::debug!("a client certificate names none of client_allowed_sans: refused");
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The DNS names, e-mail addresses, IP addresses and URIs a certificate names (none when it
/// does not parse).
fn subject_alt_names(der: &CertificateDer<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(s) | GeneralName::RFC822Name(s) | GeneralName::URI(s) => {
                Some(s.to_string())
            }
            GeneralName::IPAddress(b) => match b.len() {
                4 => <[u8; 4]>::try_from(*b)
                    .ok()
                    .map(|a| std::net::Ipv4Addr::from(a).to_string()),
                16 => <[u8; 16]>::try_from(*b)
                    .ok()
                    .map(|a| std::net::Ipv6Addr::from(a).to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn lower(name: &'static str) -> &'static str {
    match name {
        "Strict-Transport-Security" => "strict-transport-security",
        "X-Content-Type-Options" => "x-content-type-options",
        "X-Frame-Options" => "x-frame-options",
        "X-XSS-Protection" => "x-xss-protection",
        _ => "content-security-policy",
    }
}

fn unreachable_ca<T>(err: &impl Fn(&str, String) -> WebConfigError) -> Result<T, WebConfigError> {
    Err(err(
        "tls_server_config.client_ca_file",
        "missing: client certificates cannot be verified without it".into(),
    ))
}

fn rank(v: &SupportedProtocolVersion) -> u8 {
    if v.version == rustls::ProtocolVersion::TLSv1_3 {
        13
    } else {
        12
    }
}

fn version(
    name: Option<&str>,
    key: &str,
    err: &impl Fn(&str, String) -> WebConfigError,
) -> Result<Option<&'static SupportedProtocolVersion>, WebConfigError> {
    match name.unwrap_or("") {
        "" => Ok(None),
        // rustls speaks TLS 1.2 and 1.3 only: an older minimum is met by 1.2.
        "TLS10" | "TLS11" | "TLS12" => Ok(Some(&rustls::version::TLS12)),
        "TLS13" => Ok(Some(&rustls::version::TLS13)),
        other => Err(err(
            key,
            format!("unknown version {other:?}: use TLS12 or TLS13 (TLS10 and TLS11 are taken as TLS12: dxdp never speaks older versions)"),
        )),
    }
}

/// The TLS 1.2 suites named (Go's names, as the exporters take them), plus every TLS 1.3 suite
/// (which, as in Go, `cipher_suites` does not choose).
fn cipher_suites(
    names: &[String],
    err: &impl Fn(&str, String) -> WebConfigError,
) -> Result<Vec<SupportedCipherSuite>, WebConfigError> {
    let all = rustls::crypto::ring::ALL_CIPHER_SUITES;
    let name_of = |s: &SupportedCipherSuite| format!("{:?}", s.suite());
    let tls12: Vec<String> = all
        .iter()
        .filter(|s| s.version() == &rustls::version::TLS12)
        .map(name_of)
        .collect();
    let mut chosen: Vec<SupportedCipherSuite> = all
        .iter()
        .filter(|s| s.version() == &rustls::version::TLS13)
        .copied()
        .collect();
    for (i, name) in names.iter().enumerate() {
        // Go also names the ChaCha20 suites without the _SHA256 suffix.
        let wanted = if name.ends_with("_CHACHA20_POLY1305") {
            format!("{name}_SHA256")
        } else {
            name.clone()
        };
        match all.iter().find(|s| name_of(s) == wanted) {
            Some(s) if s.version() == &rustls::version::TLS12 => {
                if !chosen.iter().any(|c| c.suite() == s.suite()) {
                    chosen.push(*s);
                }
            }
            _ => {
                return Err(err(
                    &format!("tls_server_config.cipher_suites[{i}]"),
                    format!(
                        "{name} is not offered (dxdp offers only ECDHE suites with AEAD ciphers; TLS 1.3 suites are always on): use one of {}",
                        tls12.join(", ")
                    ),
                ))
            }
        }
    }
    Ok(chosen)
}

/// `Basic base64(user:password)` into its user and password.
fn parse_basic(value: &[u8]) -> Option<(String, String)> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, rest) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// What a reload did (`dxdp_web_config_reloads_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reloaded {
    /// A changed, valid configuration is in force.
    Applied,
    /// A changed configuration did not load; the last good one stays.
    Rejected,
}

/// The web configuration in force, re-read when its files change.
pub struct Web {
    path: PathBuf,
    /// The HostProcess sandbox mount point the files are looked up under first.
    sandbox: Option<String>,
    state: Mutex<State>,
    verifier: Verifier,
    on_reload: Box<dyn Fn(Reloaded) + Send + Sync>,
}

impl std::fmt::Debug for Web {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Web")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

struct State {
    current: Arc<WebConfig>,
    checked: Instant,
    last_error: Option<String>,
}

impl Web {
    /// Loads `path` (an error refuses it); `on_reload` is told of each later reload.
    pub fn load(
        path: &Path,
        on_reload: impl Fn(Reloaded) + Send + Sync + 'static,
    ) -> Result<Web, WebConfigError> {
        Self::load_in(path, None, on_reload)
    }

    /// [`Web::load`] in a HostProcess container whose sandbox mount point is `sandbox`
    /// ([`WebConfig::load_in`]).
    pub(crate) fn load_in(
        path: &Path,
        sandbox: Option<String>,
        on_reload: impl Fn(Reloaded) + Send + Sync + 'static,
    ) -> Result<Web, WebConfigError> {
        let current = Arc::new(WebConfig::load_in(path, sandbox.as_deref())?);
        Ok(Web {
            sandbox,
            verifier: Verifier::start(),
            path: path.to_path_buf(),
            state: Mutex::new(State {
                current,
                checked: Instant::now(),
                last_error: None,
            }),
            on_reload: Box::new(on_reload),
        })
    }

    /// Where basic authentication's bcrypt checks run.
    pub(crate) fn verifier(&self) -> &Verifier {
        &self.verifier
    }

    /// The web configuration file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The configuration in force, without looking at the files.
    pub(crate) fn current(&self) -> Arc<WebConfig> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .current
            .clone()
    }

    /// The configuration to serve a new connection with: when [`RECHECK`] has passed since the
    /// files were last looked at and one of them changed, it is loaded again (off the async
    /// workers, within [`RELOAD_LIMIT`]).
    pub(crate) async fn fresh(self: &Arc<Self>) -> Arc<WebConfig> {
        {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if state.checked.elapsed() < RECHECK {
                return state.current.clone();
            }
            state.checked = Instant::now();
        }
        let this = self.clone();
        let reload = move || this.reload_if_changed();
        match run_blocking(RELOAD_LIMIT, "reading the web configuration", reload).await {
            Ok(current) => current,
            Err(_) => {
                tracing::warn!(file = %self.path.display(), "reading the web configuration took longer than {RELOAD_LIMIT:?}: serving with the one in force");
                self.current()
            }
        }
    }

    /// Loads the files again when one changed; returns the configuration in force.
    pub(crate) fn reload_if_changed(&self) -> Arc<WebConfig> {
        let current = self.current();
        if !current.changed() {
            return current;
        }
        let loaded = WebConfig::load_in(&self.path, self.sandbox.as_deref()).and_then(|loaded| match current.weakened_by(&loaded) {
            None => Ok(loaded),
            Some(what) => Err(WebConfigError {
                file: self.path.clone(),
                key: "(file)".into(),
                message: format!("the change would {what}, which dxdp never does while running: refused until dxdp restarts (restart it to apply the weaker configuration on purpose)"),
            }),
        });
        match loaded {
            Ok(loaded) => {
                let loaded = Arc::new(loaded);
                let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                state.current = loaded.clone();
                state.last_error = None;
                drop(state);
                tracing::info!(file = %self.path.display(), "web configuration changed: loaded it again (certificates, users and headers of new connections)");
                (self.on_reload)(Reloaded::Applied);
                loaded
            }
            Err(e) => {
                let text = e.to_string();
                let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                let first = state.last_error.as_deref() != Some(text.as_str());
                state.last_error = Some(text.clone());
                drop(state);
                if first {
                    tracing::error!("{text}; the web configuration in force stays (fix the file: it is read again when it changes)");
                    (self.on_reload)(Reloaded::Rejected);
                }
                current
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_header_parsing() {
        let v = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("prom:s3cret:x")
        );
        assert_eq!(
            parse_basic(v.as_bytes()),
            Some(("prom".into(), "s3cret:x".into()))
        );
        assert_eq!(parse_basic(b"Bearer abc"), None);
        assert_eq!(parse_basic(b"Basic !!!"), None);
        assert_eq!(parse_basic(b"Basic"), None);
    }

    fn basic(user: &str, password: &str) -> Vec<u8> {
        let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Basic {pair}").into_bytes()
    }

    /// Replaces `path` by a rename, as the kubelet swaps a Secret's files.
    fn replace(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    /// A cost-4 hash of `password`, and the same made to claim `cost` (the format is all a
    /// load checks).
    fn hash_claiming(password: &str, cost: u32) -> String {
        bcrypt::hash(password, 4)
            .unwrap()
            .replacen("$04$", &format!("${cost:02}$"), 1)
    }

    #[tokio::test]
    async fn failures_are_remembered_and_oversized_input_is_never_hashed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        let hash = bcrypt::hash("right", 4).unwrap();
        let other = bcrypt::hash("other", 5).unwrap();
        replace(
            &path,
            &format!("basic_auth_users:\n  prometheus: '{hash}'\n  grafana: '{other}'\n"),
        );
        let config = WebConfig::load(&path).unwrap();
        // The dummy hash for unknown users is at the highest configured cost.
        let dummy = config.dummy.clone().unwrap();
        assert_eq!(dummy.parse::<bcrypt::HashParts>().unwrap().get_cost(), 5);
        let verifier = Verifier::start();
        let hashes = || verifier.stats().hashes();
        let check = |header: Option<Vec<u8>>| {
            let (config, verifier) = (&config, &verifier);
            async move { config.check_basic(header.as_deref(), verifier).await }
        };
        let wrong = basic("prometheus", "wrong");
        assert_eq!(check(Some(wrong.clone())).await, BasicAuth::Failed);
        assert_eq!(hashes(), 1);
        // The same wrong password again: remembered, no hash.
        assert_eq!(check(Some(wrong)).await, BasicAuth::Failed);
        assert_eq!(hashes(), 1);
        let right = basic("prometheus", "right");
        assert_eq!(check(Some(right.clone())).await, BasicAuth::Passed);
        assert_eq!(check(Some(right)).await, BasicAuth::Passed);
        assert_eq!(hashes(), 2);
        // An unknown user pays a hash (the dummy's), and never passes.
        assert_eq!(
            check(Some(basic("mallory", "right"))).await,
            BasicAuth::Failed
        );
        assert_eq!(hashes(), 3);
        // Refused before any work: no header, not Basic, a password over 72 bytes, a header
        // over 4 KiB.
        let long_password = basic("prometheus", &"p".repeat(MAX_PASSWORD + 1));
        let mut long_header = basic("prometheus", "right");
        long_header.resize(MAX_AUTHORIZATION + 1, b' ');
        for header in [
            None,
            Some(b"Bearer x".to_vec()),
            Some(long_password),
            Some(long_header),
        ] {
            assert_eq!(check(header).await, BasicAuth::Failed);
        }
        assert_eq!(hashes(), 3);
    }

    #[test]
    fn costs_above_12_and_empty_files_are_refused_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        replace(
            &path,
            &format!(
                "basic_auth_users:\n  prometheus: '{}'\n",
                hash_claiming("x", 13)
            ),
        );
        let e = WebConfig::load(&path).unwrap_err();
        assert_eq!(e.key, "basic_auth_users.prometheus");
        assert!(
            e.message
                .starts_with("bcrypt cost 13 is above 12, the highest dxdp accepts"),
            "{e}"
        );
        assert!(e.message.contains("htpasswd -nBC 10"), "{e}");
        replace(
            &path,
            &format!(
                "basic_auth_users:\n  prometheus: '{}'\n",
                hash_claiming("x", 12)
            ),
        );
        assert!(WebConfig::load(&path).unwrap().has_users());
        for empty in ["", "  \n\t\n", "# nothing yet\n\n"] {
            replace(&path, empty);
            let e = WebConfig::load(&path).unwrap_err();
            assert_eq!(e.key, "(file)", "{empty:?}");
            assert!(e.message.starts_with("the file is empty: "), "{e}");
        }
    }

    #[test]
    fn rate_limit_is_a_token_bucket_as_the_exporters_read_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        replace(&path, "rate_limit:\n  interval: 1h\n  burst: 2\n");
        let config = WebConfig::load(&path).unwrap();
        let allowed: Vec<bool> = (0..3).map(|_| config.rate_allows()).collect();
        assert_eq!(allowed, [true, true, false]);
        replace(&path, "rate_limit:\n  interval: 0\n  burst: 0\n");
        assert!(WebConfig::load(&path).unwrap().rate_limit.is_none());
        let refused = [
            (
                "rate_limit:\n  interval: 1s\n  burst: 0\n",
                "rate_limit.burst",
            ),
            (
                "rate_limit:\n  interval: 5\n  burst: 1\n",
                "rate_limit.interval",
            ),
            ("rate_limit:\n  every: 1s\n", "line 2 column 3"),
        ];
        for (text, key) in refused {
            replace(&path, text);
            assert_eq!(WebConfig::load(&path).unwrap_err().key, key, "{text}");
        }
        let parsed = ["1s", "250ms", "1m30s", "1.5s", "2h", "0", "100us"].map(go_duration);
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(
            parsed,
            [
                ms(1000),
                ms(250),
                ms(90_000),
                ms(1500),
                ms(7_200_000),
                ms(0),
                Some(Duration::from_micros(100))
            ]
        );
        assert_eq!(["", "5", "1x", "s", "-1s"].map(go_duration), [None; 5]);
    }

    /// A self-signed server certificate and key for localhost, and a CA, client certificate and
    /// key naming `sans`, written in `dir`; the web configuration's TLS lines for them.
    fn pki(dir: &Path) -> String {
        let server = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(dir.join("server.pem"), server.cert.pem()).unwrap();
        std::fs::write(
            dir.join("server-key.pem"),
            server.signing_key.serialize_pem(),
        )
        .unwrap();
        std::fs::write(dir.join("ca.pem"), server.cert.pem()).unwrap();
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server-key.pem\n".into()
    }

    /// containerd 1.6 puts the pod's Secret under the sandbox mount point: the certificates a
    /// web configuration names by absolute paths are read from there, not from the host path.
    #[test]
    fn certificates_named_by_absolute_paths_are_read_from_the_pods_volume_first() {
        let sandbox = tempfile::tempdir().unwrap();
        let host = if cfg!(windows) {
            r"C:\dxdp-test-absent-tls"
        } else {
            "/dxdp-test-absent-tls"
        };
        let in_pod = sandbox.path().join("dxdp-test-absent-tls");
        std::fs::create_dir_all(&in_pod).unwrap();
        pki(&in_pod);
        let sep = std::path::MAIN_SEPARATOR;
        let path = in_pod.join("web.yml");
        std::fs::write(
            &path,
            format!("tls_server_config:\n  cert_file: '{host}{sep}server.pem'\n  key_file: '{host}{sep}server-key.pem'\n"),
        )
        .unwrap();
        let e = WebConfig::load(&path).unwrap_err();
        assert_eq!(e.key, "tls_server_config.cert_file", "{e}");
        let sandbox = sandbox.path().to_string_lossy().into_owned();
        let loaded = WebConfig::load_in(&path, Some(&sandbox)).unwrap();
        assert!(loaded.tls().is_some());
    }

    #[test]
    fn a_reload_that_weakens_the_guard_is_refused_until_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        let tls = pki(dir.path());
        let users = format!(
            "basic_auth_users:\n  prometheus: '{}'\n",
            bcrypt::hash("x", 4).unwrap()
        );
        let verify = "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n";
        let sans = "  client_allowed_sans: [prometheus.monitoring.svc]\n";
        replace(&path, &format!("{tls}{verify}{sans}{users}"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let web = {
            let seen = seen.clone();
            Web::load(&path, move |r| seen.lock().unwrap().push(r)).unwrap()
        };
        let weaker = [
            (users.clone(), "drop TLS (plain HTTP)"),
            (
                format!("{tls}  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.pem\n{users}"),
                "weaken client certificate verification (client_auth_type)",
            ),
            (format!("{tls}{verify}{users}"), "drop client_allowed_sans"),
            (
                format!("{tls}{verify}{sans}"),
                "drop basic_auth_users (no authentication)",
            ),
        ];
        for (i, (text, what)) in weaker.iter().enumerate() {
            replace(&path, text);
            let kept = web.reload_if_changed();
            assert!(kept.tls().is_some() && kept.has_users(), "{what}");
            assert_eq!(kept.client_auth(), ClientAuth::Require, "{what}");
            assert_eq!(kept.allowed_sans, ["prometheus.monitoring.svc"], "{what}");
            assert_eq!(seen.lock().unwrap().len(), i + 1, "{what}");
            let said = web.state.lock().unwrap().last_error.clone().unwrap();
            assert_eq!(
                said,
                format!("web configuration {}: (file): the change would {what}, which dxdp never does while running: refused until dxdp restarts (restart it to apply the weaker configuration on purpose)", path.display())
            );
        }
        assert!(seen
            .lock()
            .unwrap()
            .iter()
            .all(|r| *r == Reloaded::Rejected));
        // As strong, another header: applied.
        replace(
            &path,
            &format!("{tls}{verify}{sans}{users}http_server_config:\n  headers:\n    X-Frame-Options: deny\n"),
        );
        assert_eq!(web.reload_if_changed().headers().len(), 1);
        assert_eq!(seen.lock().unwrap().last(), Some(&Reloaded::Applied));
        // A restart takes the weaker file.
        replace(&path, &users);
        assert!(Web::load(&path, |_| {}).unwrap().current().tls().is_none());
    }

    #[test]
    fn client_allowed_sans_needs_verified_certificates_and_matches_every_kind_of_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        let tls = pki(dir.path());
        for auth in [
            "",
            "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.pem\n",
        ] {
            replace(&path, &format!("{tls}{auth}  client_allowed_sans: [a]\n"));
            let e = WebConfig::load(&path).unwrap_err();
            assert_eq!(e.key, "tls_server_config.client_allowed_sans", "{e}");
            assert!(e.message.contains("RequireAndVerifyClientCert"), "{e}");
        }
        let mut params =
            rcgen::CertificateParams::new(vec!["prometheus.example".to_string()]).unwrap();
        params.subject_alt_names.extend([
            rcgen::SanType::IpAddress("10.0.0.7".parse().unwrap()),
            rcgen::SanType::IpAddress("fd00::7".parse().unwrap()),
            rcgen::SanType::Rfc822Name("ops@example.com".try_into().unwrap()),
            rcgen::SanType::URI(
                "spiffe://cluster.local/ns/monitoring/sa/prometheus"
                    .try_into()
                    .unwrap(),
            ),
        ]);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            subject_alt_names(cert.der()),
            [
                "prometheus.example",
                "10.0.0.7",
                "fd00::7",
                "ops@example.com",
                "spiffe://cluster.local/ns/monitoring/sa/prometheus"
            ]
        );
        assert!(subject_alt_names(&CertificateDer::from(vec![1, 2, 3])).is_empty());
    }
}
