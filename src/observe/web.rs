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
//! The metrics endpoint therefore never falls back to plain HTTP or to no authentication.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use http::header::{HeaderName, HeaderValue};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, SupportedCipherSuite, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use crate::util::bounded::run_blocking;
use crate::util::stable_read::{self, Stamp};

/// How often, at most, the files are looked at again for a change.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// The largest web configuration, certificate, key or CA file read.
pub(crate) const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// How long a reload (reading a handful of small files) may take before the connection is
/// served with the configuration in force.
pub(crate) const RELOAD_LIMIT: Duration = Duration::from_secs(5);

/// The most verified user and password pairs remembered (so that a scrape every few seconds
/// does not pay bcrypt's cost each time); failed attempts are never remembered.
pub(crate) const AUTH_CACHE: usize = 64;

/// The headers `http_server_config.headers` may set (as the exporters allow).
pub(crate) const ALLOWED_HEADERS: [&str; 5] = [
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
    "Content-Security-Policy",
];

/// A valid bcrypt hash of a password nobody has, checked against for an unknown user so that
/// an unknown user costs as much time as a known one (cost 10, like `htpasswd -B`).
const DUMMY_HASH: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";

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
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<String>,
    key_file: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<String>,
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

/// Whether and how clients show certificates (`client_auth_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    users: BTreeMap<String, String>,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// The files it was loaded from, with their stamps when loaded.
    files: Vec<(PathBuf, Option<Stamp>)>,
    /// Digests of user and password pairs that passed, with the hash they passed against.
    verified: Mutex<Vec<[u8; 32]>>,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("client_auth", &self.client_auth)
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .field("headers", &self.headers)
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
    /// Missing, malformed, unknown user or wrong password.
    Failed,
}

impl WebConfig {
    /// Reads and checks `path` and every file it names (relative paths are relative to the
    /// directory of `path`, as in the exporters).
    pub fn load(path: &Path) -> Result<WebConfig, WebConfigError> {
        let err = |key: &str, message: String| WebConfigError {
            file: path.to_path_buf(),
            key: key.to_string(),
            message,
        };
        let mut files = vec![(path.to_path_buf(), Stamp::of(path).ok())];
        let text = stable_read::read_once(path, MAX_FILE_BYTES)
            .map_err(|e| err("(file)", format!("cannot read it: {e}")))?;
        let parsed: WebConfigFile = if text.trim().is_empty() {
            WebConfigFile::default()
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
                p.to_path_buf()
            } else {
                dir.join(p)
            }
        };
        let mut read_file = |key: &str, name: &str| -> Result<String, WebConfigError> {
            let p = resolve(name);
            files.push((p.clone(), Stamp::of(&p).ok()));
            stable_read::read_once(&p, MAX_FILE_BYTES)
                .map_err(|e| err(key, format!("cannot read {}: {e}", p.display())))
        };

        let mut client_auth = ClientAuth::None;
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
                        builder.with_client_cert_verifier(verifier)
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
        for (user, hash) in parsed.basic_auth_users.unwrap_or_default() {
            let key = format!("basic_auth_users.{user}");
            if user.is_empty() || user.contains(':') {
                return Err(err(
                    &key,
                    "a user name must be non-empty and hold no ':'".into(),
                ));
            }
            if hash.parse::<bcrypt::HashParts>().is_err() {
                return Err(err(
                    &key,
                    "not a bcrypt hash ($2a$, $2b$ or $2y$, 60 characters): make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'` and write the hash, never the password".into(),
                ));
            }
            users.insert(user, hash);
        }

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
            users,
            headers,
            files,
            verified: Mutex::default(),
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

    /// Checks an `Authorization` header value against `basic_auth_users`. Blocks for bcrypt's
    /// time (tens of milliseconds at cost 10) unless the pair passed before: call it off the
    /// async workers.
    pub(crate) fn check_basic(&self, authorization: Option<&[u8]>) -> BasicAuth {
        if self.users.is_empty() {
            return BasicAuth::NotConfigured;
        }
        let Some((user, password)) = authorization.and_then(parse_basic) else {
            return BasicAuth::Failed;
        };
        let hash = self.users.get(&user);
        let digest = {
            let mut d = ring::digest::Context::new(&ring::digest::SHA256);
            for part in [
                user.as_bytes(),
                password.as_bytes(),
                hash.map_or(&[][..], |h| h.as_bytes()),
            ] {
                d.update(&(part.len() as u64).to_le_bytes());
                d.update(part);
            }
            let mut out = [0u8; 32];
            out.copy_from_slice(d.finish().as_ref());
            out
        };
        if hash.is_some() && self.remembered(&digest) {
            return BasicAuth::Passed;
        }
        // An unknown user is checked against a dummy hash: the same time as a wrong password.
        let passed = bcrypt::verify(password.as_bytes(), hash.map_or(DUMMY_HASH, String::as_str))
            .unwrap_or(false);
        if passed && hash.is_some() {
            let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
            if verified.len() >= AUTH_CACHE {
                verified.clear();
            }
            verified.push(digest);
            BasicAuth::Passed
        } else {
            BasicAuth::Failed
        }
    }

    fn remembered(&self, digest: &[u8; 32]) -> bool {
        let verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        verified
            .iter()
            .any(|d| bool::from(subtle::ConstantTimeEq::ct_eq(&d[..], &digest[..])))
    }

    fn changed(&self) -> bool {
        self.files
            .iter()
            .any(|(path, stamp)| Stamp::of(path).ok() != *stamp)
    }
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
    state: Mutex<State>,
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
        let current = Arc::new(WebConfig::load(path)?);
        Ok(Web {
            path: path.to_path_buf(),
            state: Mutex::new(State {
                current,
                checked: Instant::now(),
                last_error: None,
            }),
            on_reload: Box::new(on_reload),
        })
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
        match WebConfig::load(&self.path) {
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

    #[test]
    fn the_dummy_hash_is_a_bcrypt_hash() {
        assert!(DUMMY_HASH.parse::<bcrypt::HashParts>().is_ok());
    }
}
