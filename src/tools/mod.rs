//! Node tools as pure functions: device selection and container flags (`dxdp mounts`), the HCS
//! verdict (`dxdp hcs`) and preflight checks (`dxdp doctor`). The CLI gathers the inputs
//! (facts, probes of the live node) and prints what these return.

pub mod doctor;
pub mod hcs;
pub mod mounts;
pub mod select;
pub mod shell;
pub mod validate;
