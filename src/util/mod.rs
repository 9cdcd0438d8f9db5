//! Small utilities shared across the layers: retry backoff ([`retry`]) and error text
//! ([`errors`]). Nothing here knows of the kubelet, the cluster or the configuration.

pub mod errors;
pub mod retry;
