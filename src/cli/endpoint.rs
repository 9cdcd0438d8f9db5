//! `--endpoint` and how to reach it, shared by `dxdp top` and `dxdp audit`: a running daemon's
//! `/metrics` over plain HTTP or HTTPS, with a CA or no check, a client certificate, and a
//! bearer token or basic-auth credentials. The flags are kubectl's where kubectl has one
//! (`--certificate-authority`, `--insecure-skip-tls-verify`, `--tls-server-name`,
//! `--client-certificate`, `--client-key`); secrets come only from files (`--token-file`,
//! `--password-file`), never from the command line, where every user of the machine can read
//! them in the process list and the shell keeps them in its history.

use std::path::PathBuf;

use clap::Args;

use dxdp::telemetry::scrape::Options;

/// The daemon to read and how (`--endpoint` and the flags of a secured endpoint).
#[derive(Debug, Clone, Args)]
pub(crate) struct EndpointArgs {
    /// Read a running daemon's /metrics instead of sampling the GPUs here: HOST:PORT (its
    /// metrics.address, e.g. 127.0.0.1:9466), http://HOST:PORT[/PATH] or
    /// https://HOST[:PORT][/PATH].
    #[arg(long, value_name = "URL")]
    pub(crate) endpoint: Option<String>,
    /// With https://: trust the CA certificates in this PEM file (e.g. cert-manager's ca.crt)
    /// instead of the system's trust store.
    #[arg(
        long,
        value_name = "FILE",
        alias = "cacert",
        requires = "endpoint",
        help_heading = "Secured endpoint"
    )]
    certificate_authority: Option<PathBuf>,
    /// With https://: do not check the server's certificate (the connection is still
    /// encrypted, but to whoever answers).
    #[arg(
        long,
        requires = "endpoint",
        conflicts_with = "certificate_authority",
        help_heading = "Secured endpoint"
    )]
    insecure_skip_tls_verify: bool,
    /// With https://: the name the server's certificate must carry (and the SNI sent), when
    /// the endpoint's host is not on it, e.g. the name the certificate was made for.
    #[arg(
        long,
        value_name = "NAME",
        requires = "endpoint",
        help_heading = "Secured endpoint"
    )]
    tls_server_name: Option<String>,
    /// With https://: a client certificate (PEM) for a server that requires one
    /// (client_auth_type in its web configuration).
    #[arg(long, value_name = "FILE", requires_all = ["endpoint", "client_key"],
          help_heading = "Secured endpoint")]
    client_certificate: Option<PathBuf>,
    /// The private key (PEM) of --client-certificate.
    #[arg(
        long,
        value_name = "FILE",
        requires = "client_certificate",
        help_heading = "Secured endpoint"
    )]
    client_key: Option<PathBuf>,
    /// Send the bearer token in this file (read once, surrounding whitespace ignored), e.g. a
    /// service account's token for metrics.authorization: kubernetes.
    #[arg(long, value_name = "FILE", requires = "endpoint",
          conflicts_with_all = ["username", "password_file"], help_heading = "Secured endpoint")]
    token_file: Option<PathBuf>,
    /// Send basic-auth credentials: this user (one of basic_auth_users in the daemon's web
    /// configuration), with the password in --password-file.
    #[arg(long, value_name = "USER", requires_all = ["endpoint", "password_file"],
          help_heading = "Secured endpoint")]
    username: Option<String>,
    /// The file holding --username's password (read once, surrounding whitespace ignored).
    #[arg(
        long,
        value_name = "FILE",
        requires = "username",
        help_heading = "Secured endpoint"
    )]
    password_file: Option<PathBuf>,
}

impl EndpointArgs {
    /// What the reader of the endpoint is told.
    pub(crate) fn options(&self) -> Options {
        Options {
            certificate_authority: self.certificate_authority.clone(),
            insecure_skip_tls_verify: self.insecure_skip_tls_verify,
            tls_server_name: self.tls_server_name.clone(),
            client_certificate: self.client_certificate.clone(),
            client_key: self.client_key.clone(),
            token_file: self.token_file.clone(),
            username: self.username.clone(),
            password_file: self.password_file.clone(),
        }
    }
}
