//! Small utilities shared across the layers: retry backoff ([`retry`]), error text
//! ([`errors`]), reading files that may be mid-write ([`stable_read`]) and blocking work with a
//! time limit ([`bounded`]). Nothing here knows of the kubelet, the cluster or the configuration.

pub mod bounded;
pub mod errors;
pub mod retry;
pub mod stable_read;
