//! Small utilities shared across the layers: retry backoff ([`retry`]), error text
//! ([`errors`]) and reading files that may be mid-write ([`stable_read`]). Nothing here knows of the kubelet, the cluster or the configuration.

pub mod errors;
pub mod retry;
pub mod stable_read;
