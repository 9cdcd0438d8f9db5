//! Reading a running daemon's `/metrics` for `dxdp top --endpoint` and `dxdp audit --endpoint`
//! (so that they judge exactly what Prometheus scrapes), also when the endpoint is secured as
//! docs/observability.md#securing-metrics describes: HTTPS (rustls with ring, as the server),
//! the server checked against a CA bundle, the system's trust store, or not at all when asked;
//! a client certificate; a bearer token or basic-auth credentials, each read once from a file
//! and never written anywhere. One HTTP/1.1 GET per read, no redirect followed, the whole
//! exchange within `SCRAPE_TIMEOUT` (5 s). Errors name the URL or the file and say what to give.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{header, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use crate::util::errors::chain;
use crate::util::stable_read::{self, StableReadError};

/// How long reading `/metrics` may take: connecting, the TLS handshake, the request and the
/// whole answer.
pub(crate) const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// The most bytes of a `/metrics` answer read.
const MAX_SCRAPE: usize = 64 * 1024 * 1024;
/// The largest token or password file read.
const MAX_SECRET: u64 = 64 * 1024;
/// The largest CA bundle, certificate or key file read.
const MAX_PEM: u64 = 4 * 1024 * 1024;

/// What `top` and `audit` were told about a secured endpoint (all off by default: plain HTTP
/// or HTTPS checked against the system's trust store, no credentials).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// A PEM bundle of the CAs to trust instead of the system's trust store.
    pub certificate_authority: Option<PathBuf>,
    /// Do not check the server's certificate at all (the connection is still encrypted).
    pub insecure_skip_tls_verify: bool,
    /// The name the server's certificate must carry (and the SNI sent), instead of the host.
    pub tls_server_name: Option<String>,
    /// A client certificate (PEM, with its chain) and its key, for a server that requires one.
    pub client_certificate: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub client_key: Option<PathBuf>,
    /// A file holding a bearer token (sent as `Authorization: Bearer …`).
    pub token_file: Option<PathBuf>,
    /// The basic-auth user (with `password_file`).
    pub username: Option<String>,
    /// A file holding the basic-auth password.
    pub password_file: Option<PathBuf>,
}

/// Why the metrics could not be read (or a reader not be set up): one line naming the URL or
/// the file, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScrapeError(String);

fn fail<T>(message: impl Into<String>) -> Result<T, ScrapeError> {
    Err(ScrapeError(message.into()))
}

/// Where the metrics are: `HOST:PORT`, `http://HOST[:PORT][/PATH]` or
/// `https://HOST[:PORT][/PATH]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// Whether the endpoint is `https://`.
    pub(crate) https: bool,
    /// The host as written (without the brackets of an IPv6 address).
    pub(crate) host: String,
    /// The port (80 or 443 when an `http://` or `https://` URL gives none).
    pub(crate) port: u16,
    /// The path and query (`/metrics` when none is given).
    pub(crate) path: String,
}

impl Target {
    /// `HOST:PORT`, with an IPv6 address in brackets.
    pub(crate) fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The URL, for messages.
    pub(crate) fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}{}", self.address(), self.path)
    }

    fn is_loopback(&self) -> bool {
        self.host.eq_ignore_ascii_case("localhost")
            || self
                .host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

/// Parses an endpoint as `top` and `audit` take it.
pub(crate) fn parse_endpoint(endpoint: &str) -> Result<Target, ScrapeError> {
    let text = endpoint.trim();
    let lower = text.to_ascii_lowercase();
    let (https, rest, scheme_given) = if lower.starts_with("https://") {
        (true, &text["https://".len()..], true)
    } else if lower.starts_with("http://") {
        (false, &text["http://".len()..], true)
    } else if let Some((scheme, _)) = text.split_once("://") {
        return fail(format!(
            "{endpoint}: scheme {scheme}:// is not one dxdp reads: use http:// or https://"
        ));
    } else {
        (false, text, false)
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return fail(format!(
            "{endpoint}: credentials in the URL are not sent: give --username and --password-file, or --token-file"
        ));
    }
    let not_host_port = || {
        fail(format!(
            "{endpoint} is not HOST:PORT: use the daemon's metrics.address, e.g. 127.0.0.1:9466, or an http:// or https:// URL"
        ))
    };
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let Some((host, after)) = bracketed.split_once(']') else {
            return not_host_port();
        };
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return not_host_port(),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => {
                return fail(format!(
                    "{endpoint}: write an IPv6 address in brackets, e.g. [::1]:9466"
                ))
            }
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return fail(format!(
                    "{endpoint}: port {p:?} is not a number from 1 to 65535"
                ))
            }
        },
        None if scheme_given && https => 443,
        None if scheme_given => 80,
        None => return not_host_port(),
    };
    if host.is_empty() {
        return not_host_port();
    }
    let path = match path.trim_end_matches('/') {
        "" => "/metrics".to_string(),
        p if p.starts_with('?') => format!("/metrics{p}"),
        p => p.to_string(),
    };
    if path.parse::<http::uri::PathAndQuery>().is_err() {
        return fail(format!(
            "{endpoint}: {path:?} is not a valid URL path (escape spaces and the like with %XX)"
        ));
    }
    Ok(Target {
        https,
        host: host.to_string(),
        port,
        path,
    })
}

/// How the server's certificate is checked, for messages.
#[derive(Debug, Clone)]
enum Trust {
    CaFile(PathBuf),
    System,
    Nothing,
}

/// What the request carries, for messages (the secret itself is only in the header value).
#[derive(Debug, Clone)]
enum Credentials {
    None,
    Token(PathBuf),
    Basic(String, PathBuf),
}

/// A reader of one endpoint's metrics, with its TLS set-up and credentials read once.
pub struct Scraper {
    target: Target,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    trust: Trust,
    credentials: Credentials,
    authorization: Option<HeaderValue>,
}

impl fmt::Debug for Scraper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the header: it holds the secret.
        f.debug_struct("Scraper")
            .field("target", &self.target)
            .field("trust", &self.trust)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

/// A file's text, or an error naming the flag and file and saying what it should hold.
fn read_file(flag: &str, path: &Path, limit: u64, holds: &str) -> Result<String, ScrapeError> {
    match stable_read::read_once(path, limit) {
        Ok(text) => Ok(text.strip_prefix('\u{feff}').unwrap_or(&text).to_string()),
        Err(StableReadError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => fail(format!(
            "{flag} {}: not UTF-8 text (Windows PowerShell 5's `>` and Out-File write UTF-16): write the file with Set-Content -Encoding ascii",
            path.display()
        )),
        Err(e) => fail(format!(
            "{flag} {}: {}: it should hold {holds}",
            path.display(),
            chain(&e)
        )),
    }
}

fn pem_certificates(flag: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, ScrapeError> {
    let text = read_file(flag, path, MAX_PEM, "PEM certificates")?;
    let certs = CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .or_else(|e| fail(format!("{flag} {}: not valid PEM: {e}", path.display())))?;
    if certs.is_empty() {
        return fail(format!(
            "{flag} {}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

impl Scraper {
    /// Reads the files `options` name (once) and sets up TLS; nothing is sent yet. Flags that
    /// do not fit the endpoint (TLS options with `http://`, two kinds of credentials, half a
    /// pair) are errors.
    pub fn new(endpoint: &str, options: &Options) -> Result<Scraper, ScrapeError> {
        let target = parse_endpoint(endpoint)?;
        let url = target.url();
        if !target.https {
            let tls_flags = [
                (
                    options.certificate_authority.is_some(),
                    "--certificate-authority",
                ),
                (
                    options.insecure_skip_tls_verify,
                    "--insecure-skip-tls-verify",
                ),
                (options.tls_server_name.is_some(), "--tls-server-name"),
                (options.client_certificate.is_some(), "--client-certificate"),
                (options.client_key.is_some(), "--client-key"),
            ];
            if let Some((_, flag)) = tls_flags.iter().find(|(given, _)| *given) {
                return fail(format!(
                    "{flag} is for an https:// endpoint, and {url} is plain HTTP: write https://{}{} if the daemon serves TLS",
                    target.address(),
                    target.path
                ));
            }
        }
        if options.insecure_skip_tls_verify && options.certificate_authority.is_some() {
            return fail(
                "--certificate-authority and --insecure-skip-tls-verify contradict each other: give one",
            );
        }
        let (trust, tls) = if target.https {
            let (trust, config) = tls_config(options)?;
            let name = options.tls_server_name.as_deref().unwrap_or(&target.host);
            let server_name = ServerName::try_from(name.to_string()).or_else(|_| {
                fail(format!(
                    "{name:?} is not a host name or IP address to check the certificate for"
                ))
            })?;
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            (trust, Some((connector, server_name)))
        } else {
            (Trust::Nothing, None)
        };
        let (credentials, authorization) = credentials(options)?;
        Ok(Scraper {
            target,
            tls,
            trust,
            credentials,
            authorization,
        })
    }

    /// The URL the metrics are read from (`/metrics` added when the endpoint has no path).
    pub fn url(&self) -> String {
        self.target.url()
    }

    /// A warning for credentials sent in the clear off this machine, else `None`.
    pub fn exposure(&self) -> Option<String> {
        let what = match &self.credentials {
            Credentials::None => return None,
            Credentials::Token(_) => "the bearer token",
            Credentials::Basic(..) => "the password",
        };
        (!self.target.https && !self.target.is_loopback()).then(|| {
            format!(
                "{} is plain HTTP: {what} crosses the network readable by anyone on the path; serve /metrics over TLS and use https://",
                self.target.url()
            )
        })
    }

    /// Reads the metrics text (one GET, within `SCRAPE_TIMEOUT`).
    pub async fn fetch(&self) -> Result<String, ScrapeError> {
        let url = self.target.url();
        match tokio::time::timeout(SCRAPE_TIMEOUT, self.exchange()).await {
            Ok(result) => result,
            Err(_) => fail(format!("{url} did not answer within {SCRAPE_TIMEOUT:?}")),
        }
    }

    async fn exchange(&self) -> Result<String, ScrapeError> {
        let address = self.target.address();
        let tcp = tokio::net::TcpStream::connect(&address).await.or_else(|e| {
            fail(format!(
                "cannot connect to {address}: {e} (is `dxdp plugin` running with metrics.address {address}?)"
            ))
        })?;
        let request = self.request()?;
        match &self.tls {
            Some((connector, name)) => {
                let stream = connector
                    .connect(name.clone(), tcp)
                    .await
                    .or_else(|e| fail(self.tls_error(&e)))?;
                self.send(stream, request).await
            }
            None => self.send(tcp, request).await,
        }
    }

    fn request(&self) -> Result<Request<Empty<Bytes>>, ScrapeError> {
        let mut request = Request::get(self.target.path.as_str())
            .header(header::HOST, self.target.address())
            .header(header::ACCEPT, "text/plain")
            .header(
                header::USER_AGENT,
                concat!("dxdp/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(value) = &self.authorization {
            request = request.header(header::AUTHORIZATION, value.clone());
        }
        request
            .body(Empty::new())
            .or_else(|e| fail(format!("{}: {e}", self.target.url())))
    }

    async fn send<S>(
        &self,
        stream: S,
        request: Request<Empty<Bytes>>,
    ) -> Result<String, ScrapeError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let url = self.target.url();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .or_else(|e| fail(self.exchange_error(&e)))?;
        // Driven on its own task; it ends once the answer is read and the sender dropped, and is
        // aborted when the time limit drops this exchange (a server that never answers).
        let mut driver = AbortOnDrop(tokio::spawn(connection));
        let answer = async {
            let response = sender.send_request(request).await?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = Limited::new(response.into_body(), MAX_SCRAPE)
                .collect()
                .await
                .map(|b| b.to_bytes());
            Ok::<_, hyper::Error>((status, headers, body))
        }
        .await;
        drop(sender);
        let (status, headers, body) = match answer {
            Ok(answer) => answer,
            Err(e) => {
                // The connection's own error (a TLS alert, a reset) says more than the
                // request's "canceled"; it has ended or is ending (within the time limit).
                return match (&mut driver.0).await {
                    Ok(Err(cause)) => fail(self.exchange_error(&cause)),
                    _ => fail(self.exchange_error(&e)),
                };
            }
        };
        let body = body.or_else(|e| {
            fail(match e.downcast_ref::<hyper::Error>() {
                Some(e) => self.exchange_error(e),
                None => format!("{url}: {e} (more than {MAX_SCRAPE} bytes)"),
            })
        })?;
        let text = String::from_utf8_lossy(&body).into_owned();
        if status == StatusCode::OK {
            Ok(text)
        } else {
            fail(self.status_error(status, &headers, &text))
        }
    }

    /// What to do about an answer other than 200.
    fn status_error(&self, status: StatusCode, headers: &http::HeaderMap, body: &str) -> String {
        let url = self.target.url();
        let said: String = body
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_control())
            .take(300)
            .collect();
        let said = if said.is_empty() {
            String::new()
        } else {
            format!(" ({said})")
        };
        let head = format!("{url} answered {status}{said}");
        let challenge = headers
            .get(header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        let wants = if challenge.starts_with("basic") {
            "a user and password (basic_auth_users of its web configuration): give --username USER --password-file FILE"
        } else if challenge.starts_with("bearer") {
            "a bearer token (metrics.authorization: kubernetes): give --token-file FILE with the token of a service account that may get /metrics"
        } else {
            "credentials: give --token-file FILE, or --username USER --password-file FILE"
        };
        match status {
            StatusCode::UNAUTHORIZED => match &self.credentials {
                Credentials::None => format!("{head}: the endpoint wants {wants}"),
                Credentials::Token(file) if challenge.starts_with("basic") => format!(
                    "{head}: the endpoint wants a user and password, not a token: give --username USER --password-file FILE instead of --token-file {}",
                    file.display()
                ),
                Credentials::Basic(..) if challenge.starts_with("bearer") => format!(
                    "{head}: the endpoint wants a bearer token, not a password: give --token-file FILE instead of --username and --password-file"
                ),
                Credentials::Token(file) => format!(
                    "{head}: the token in {} was refused (expired or not of this cluster?): give a current one with --token-file",
                    file.display()
                ),
                Credentials::Basic(user, file) => format!(
                    "{head}: user {user:?} with the password in {} was refused: check both against basic_auth_users of the daemon's web configuration",
                    file.display()
                ),
            },
            StatusCode::FORBIDDEN => format!(
                "{head}: the token's user may not get /metrics: bind it to the chart's <release>-dxdp-metrics-reader ClusterRole, or use a token of a user that may"
            ),
            s if s.is_redirection() => {
                let location = headers
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("nowhere");
                format!("{url} answered {status} to {location}: redirects are not followed; give the daemon's own address with --endpoint")
            }
            StatusCode::NOT_FOUND => format!(
                "{head}: the daemon serves its metrics at /metrics; check the path of --endpoint"
            ),
            _ => head,
        }
    }

    /// What to do about a failed TLS handshake.
    fn tls_error(&self, error: &(dyn std::error::Error + 'static)) -> String {
        let url = self.target.url();
        let Some(tls) = find_rustls(error) else {
            return format!("{url}: TLS handshake failed: {}", chain(error));
        };
        let trusted = match &self.trust {
            Trust::CaFile(path) => format!("the CA bundle {}", path.display()),
            Trust::System => {
                "the system's trust store, as no --certificate-authority was given".into()
            }
            Trust::Nothing => "nothing".into(),
        };
        match tls {
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
                "{url}: the server's certificate is not signed by a CA trusted here ({trusted}): give the CA that signed the daemon's certificate with --certificate-authority FILE (e.g. cert-manager's ca.crt), or skip the check with --insecure-skip-tls-verify"
            ),
            rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => format!(
                "{url}: {tls}: connect by a name the certificate carries, or name it with --tls-server-name NAME (the serverName Prometheus uses)"
            ),
            rustls::Error::InvalidCertificate(
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. },
            ) => format!(
                "{url}: {tls}: the daemon's certificate is out of date (was it renewed? is this machine's clock right?)"
            ),
            rustls::Error::InvalidMessage(_) => format!(
                "{url}: the server does not speak TLS ({tls}): if it serves plain HTTP (no tls_server_config in its web configuration), use http://{}{}",
                self.target.address(),
                self.target.path
            ),
            rustls::Error::AlertReceived(
                rustls::AlertDescription::CertificateRequired
                | rustls::AlertDescription::HandshakeFailure
                | rustls::AlertDescription::BadCertificate
                | rustls::AlertDescription::UnknownCA,
            ) => format!(
                "{url}: the server refused the connection ({tls}): it may require a client certificate signed by its client_ca_file: give --client-certificate FILE --client-key FILE"
            ),
            _ => format!("{url}: TLS: {tls}"),
        }
    }

    /// What to do about a failed HTTP exchange.
    fn exchange_error(&self, error: &hyper::Error) -> String {
        let url = self.target.url();
        if find_rustls(error).is_some() {
            return self.tls_error(error);
        }
        if !self.target.https && (error.is_parse() || error.is_incomplete_message()) {
            return format!(
                "{url}: no HTTP answer ({}): if the daemon serves TLS (tls_server_config in its web configuration), use https://{}{}",
                chain(error),
                self.target.address(),
                self.target.path
            );
        }
        format!("{url}: {}", chain(error))
    }
}

/// The TLS error in `error` or its causes.
/// A task aborted when this is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn find_rustls<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // `io::Error::source` skips the error it wraps: look inside.
        if let Some(tls) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        next = e.source();
    }
    None
}

/// The TLS client configuration `options` ask for, and how it trusts the server.
fn tls_config(options: &Options) -> Result<(Trust, ClientConfig), ScrapeError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .or_else(|e| fail(format!("TLS: {e}")))?;
    let (trust, builder) = if options.insecure_skip_tls_verify {
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)));
        (Trust::Nothing, builder)
    } else if let Some(ca) = &options.certificate_authority {
        let mut roots = RootCertStore::empty();
        let (added, _) =
            roots.add_parsable_certificates(pem_certificates("--certificate-authority", ca)?);
        if added == 0 {
            return fail(format!(
                "--certificate-authority {}: none of its certificates can be a trust anchor",
                ca.display()
            ));
        }
        (
            Trust::CaFile(ca.clone()),
            builder.with_root_certificates(roots),
        )
    } else {
        // The system's trust store: the Windows certificate store (LocalMachine and CurrentUser
        // Root), the distribution's CA bundle elsewhere (SSL_CERT_FILE and SSL_CERT_DIR honoured).
        let found = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            let why = found.errors.first().map_or_else(
                || "it holds no certificate".to_string(),
                ToString::to_string,
            );
            return fail(format!(
                "cannot use the system's trust store ({why}): give the daemon's CA with --certificate-authority FILE"
            ));
        }
        (Trust::System, builder.with_root_certificates(roots))
    };
    let mut config = match (&options.client_certificate, &options.client_key) {
        (Some(cert), Some(key)) => {
            let chain = pem_certificates("--client-certificate", cert)?;
            let text = read_file("--client-key", key, MAX_PEM, "a PEM private key")?;
            let private = PrivateKeyDer::from_pem_slice(text.as_bytes()).or_else(|e| {
                fail(format!(
                    "--client-key {}: no PEM private key in it ({e})",
                    key.display()
                ))
            })?;
            builder.with_client_auth_cert(chain, private).or_else(|e| {
                fail(format!(
                    "--client-key {} does not go with --client-certificate {}: {e}",
                    key.display(),
                    cert.display()
                ))
            })?
        }
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => return fail("--client-certificate needs --client-key"),
        (None, Some(_)) => return fail("--client-key needs --client-certificate"),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((trust, config))
}

/// The `Authorization` header `options` ask for, read once from its file.
fn credentials(options: &Options) -> Result<(Credentials, Option<HeaderValue>), ScrapeError> {
    let header = |text: String| -> Result<HeaderValue, ScrapeError> {
        let mut value = HeaderValue::try_from(text).or_else(|_| {
            fail("it holds characters an HTTP header cannot carry (a line break inside?)")
        })?;
        value.set_sensitive(true);
        Ok(value)
    };
    match (
        &options.token_file,
        &options.username,
        &options.password_file,
    ) {
        (None, None, None) => Ok((Credentials::None, None)),
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => fail(
            "--token-file and --username/--password-file both set the Authorization header: give one",
        ),
        (Some(file), None, None) => {
            let text = read_file("--token-file", file, MAX_SECRET, "a bearer token")?;
            let token = text.trim();
            if token.is_empty() {
                return fail(format!(
                    "--token-file {}: the file is empty: it should hold a bearer token (e.g. from `kubectl create token`)",
                    file.display()
                ));
            }
            let value = header(format!("Bearer {token}")).map_err(|e| {
                ScrapeError(format!("--token-file {}: {e}", file.display()))
            })?;
            Ok((Credentials::Token(file.clone()), Some(value)))
        }
        (None, Some(user), Some(file)) => {
            if user.is_empty() || user.contains(':') {
                return fail(format!(
                    "--username {user:?}: a basic-auth user name is not empty and has no colon"
                ));
            }
            let text = read_file("--password-file", file, MAX_SECRET, "the password")?;
            let password = text.trim();
            if password.is_empty() {
                return fail(format!(
                    "--password-file {}: the file is empty: it should hold the password of {user:?}",
                    file.display()
                ));
            }
            let encoded =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            let value = header(format!("Basic {encoded}"))?;
            Ok((Credentials::Basic(user.clone(), file.clone()), Some(value)))
        }
        (None, Some(_), None) => fail("--username needs --password-file"),
        (None, None, Some(_)) => fail("--password-file needs --username"),
    }
}

/// `--insecure-skip-tls-verify`: any certificate is taken; the handshake's signatures are
/// still checked (the connection is encrypted to whoever holds the certificate's key).
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_host_and_port_or_urls() {
        let ok = |text: &str, https: bool, host: &str, port: u16, path: &str| {
            assert_eq!(
                parse_endpoint(text),
                Ok(Target {
                    https,
                    host: host.into(),
                    port,
                    path: path.into()
                }),
                "{text}"
            );
        };
        ok("127.0.0.1:9466", false, "127.0.0.1", 9466, "/metrics");
        ok("http://10.0.0.5:9466/", false, "10.0.0.5", 9466, "/metrics");
        ok("http://[::1]:9466/custom", false, "::1", 9466, "/custom");
        ok("https://node-1:9466", true, "node-1", 9466, "/metrics");
        ok(
            "HTTPS://dxdp.example.com",
            true,
            "dxdp.example.com",
            443,
            "/metrics",
        );
        ok("http://localhost", false, "localhost", 80, "/metrics");
        ok(
            "https://[fe80::1]/metrics?x=1",
            true,
            "fe80::1",
            443,
            "/metrics?x=1",
        );
        ok(
            "127.0.0.1:9466?debug=1",
            false,
            "127.0.0.1",
            9466,
            "/metrics?debug=1",
        );

        let err = |text: &str, want: &str| {
            assert_eq!(
                parse_endpoint(text),
                Err(ScrapeError(want.into())),
                "{text}"
            );
        };
        err(
            "localhost",
            "localhost is not HOST:PORT: use the daemon's metrics.address, e.g. 127.0.0.1:9466, or an http:// or https:// URL",
        );
        err(
            "ftp://x:1",
            "ftp://x:1: scheme ftp:// is not one dxdp reads: use http:// or https://",
        );
        err(
            "https://prometheus:secret@x:1",
            "https://prometheus:secret@x:1: credentials in the URL are not sent: give --username and --password-file, or --token-file",
        );
        err(
            "::1:9466",
            "::1:9466: write an IPv6 address in brackets, e.g. [::1]:9466",
        );
        err(
            "x:99999",
            "x:99999: port \"99999\" is not a number from 1 to 65535",
        );
        assert_eq!(
            parse_endpoint("https://[::1]:9466/m").map(|t| (t.address(), t.url())),
            Ok(("[::1]:9466".into(), "https://[::1]:9466/m".into()))
        );
    }

    #[test]
    fn flags_that_do_not_fit_are_refused_before_anything_is_sent() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let token = dir.join("token");
        std::fs::write(&token, "\u{feff}  abc.def  \r\n").unwrap();
        let err = |endpoint: &str, options: Options| {
            Scraper::new(endpoint, &options).unwrap_err().to_string()
        };
        assert_eq!(
            err(
                "127.0.0.1:9466",
                Options {
                    insecure_skip_tls_verify: true,
                    ..Options::default()
                }
            ),
            "--insecure-skip-tls-verify is for an https:// endpoint, and http://127.0.0.1:9466/metrics is plain HTTP: write https://127.0.0.1:9466/metrics if the daemon serves TLS"
        );
        assert_eq!(
            err(
                "https://127.0.0.1:9466",
                Options {
                    token_file: Some(token.clone()),
                    username: Some("prometheus".into()),
                    password_file: Some(token.clone()),
                    ..Options::default()
                }
            ),
            "--token-file and --username/--password-file both set the Authorization header: give one"
        );
        assert_eq!(
            err(
                "https://127.0.0.1:9466",
                Options {
                    username: Some("prometheus".into()),
                    ..Options::default()
                }
            ),
            "--username needs --password-file"
        );
        let missing = dir.join("nothing");
        let e = err(
            "http://127.0.0.1:9466",
            Options {
                token_file: Some(missing.clone()),
                ..Options::default()
            },
        );
        assert!(
            e.starts_with(&format!("--token-file {}: ", missing.display()))
                && e.ends_with(": it should hold a bearer token"),
            "{e}"
        );
        let empty = dir.join("empty");
        std::fs::write(&empty, " \n").unwrap();
        assert_eq!(
            err(
                "http://127.0.0.1:9466",
                Options {
                    token_file: Some(empty.clone()),
                    ..Options::default()
                }
            ),
            format!(
                "--token-file {}: the file is empty: it should hold a bearer token (e.g. from `kubectl create token`)",
                empty.display()
            )
        );
        let utf16 = dir.join("utf16");
        std::fs::write(&utf16, [0xFF, 0xFE, b'a', 0, 0xD8, 0]).unwrap();
        let e = err(
            "http://127.0.0.1:9466",
            Options {
                token_file: Some(utf16.clone()),
                ..Options::default()
            },
        );
        assert!(e.contains("not UTF-8 text"), "{e}");
        // The token is read once, trimmed (a BOM and the line end too), and never shown.
        let s = Scraper::new(
            "http://10.0.0.5:9466",
            &Options {
                token_file: Some(token.clone()),
                ..Options::default()
            },
        )
        .unwrap();
        std::fs::remove_file(&token).unwrap();
        let header = s.request().unwrap();
        assert_eq!(header.headers()[header::AUTHORIZATION], "Bearer abc.def");
        assert!(header.headers()[header::AUTHORIZATION].is_sensitive());
        assert!(!format!("{s:?}").contains("abc.def"), "{s:?}");
        assert_eq!(
            s.exposure().as_deref(),
            Some("http://10.0.0.5:9466/metrics is plain HTTP: the bearer token crosses the network readable by anyone on the path; serve /metrics over TLS and use https://")
        );
        // Basic auth: user:password in base64 (RFC 7617), the password file's line end dropped.
        let password = dir.join("password");
        std::fs::write(&password, "test-only-password\n").unwrap();
        let s = Scraper::new(
            "127.0.0.1:9466",
            &Options {
                username: Some("prometheus".into()),
                password_file: Some(password),
                ..Options::default()
            },
        )
        .unwrap();
        // base64 of "prometheus:test-only-password", from `printf %s … | base64`.
        assert_eq!(
            s.request().unwrap().headers()[header::AUTHORIZATION],
            "Basic cHJvbWV0aGV1czp0ZXN0LW9ubHktcGFzc3dvcmQ="
        );
        assert_eq!(s.exposure(), None, "loopback");
    }
}
