//! Small utilities shared across the layers: retry backoff ([`retry`]), error text
//! ([`errors`]), reading files that may be mid-write ([`stable_read`]), blocking work with a
//! time limit ([`bounded`]), what a file or directory is whatever it is called ([`file_id`]) and
//! where a HostProcess container's volumes are ([`host_process`]).
//! Nothing here knows of the kubelet, the cluster or the configuration.

pub mod bounded;
pub mod errors;
pub mod file_id;
pub mod host_process;
pub mod retry;
pub mod stable_read;
