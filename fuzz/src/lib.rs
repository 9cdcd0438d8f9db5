//! Shared pieces of the fuzz targets: the root crate's pure parsers compiled from their own source
//! files (so fuzzing builds only `dxdp-core`, serde and tracing-subscriber, not tokio/tonic), and a byte decoder that
//! turns fuzz input into host facts.

/// `src/config/file.rs`: the configuration file as a document (named `file`, as `schema.rs` uses it
/// as `super::file`).
#[path = "../../src/config/file.rs"]
#[allow(dead_code)]
pub mod file;

/// `src/config/values.rs`: the checked values of the configuration file (`file.rs` uses them as
/// `super::values`).
#[path = "../../src/config/values.rs"]
#[allow(dead_code)]
pub mod values;

/// `src/config/parse.rs`: the configuration file's YAML parser and its errors.
#[path = "../../src/config/parse.rs"]
#[allow(dead_code)]
pub mod parse;

/// `src/config/schema.rs`: the JSON Schema (`file.rs` names its functions as
/// `super::schema`).
#[path = "../../src/config/schema.rs"]
#[allow(dead_code)]
pub mod schema;

/// `src/config/health.rs`: the `health` section of the configuration file, which `file.rs` uses
/// as `super::health`.
#[path = "../../src/config/health.rs"]
#[allow(dead_code)]
pub mod health;

/// `src/config/validation.rs`: the `validation` section of the configuration file, which
/// `file.rs` uses as `super::validation`.
#[path = "../../src/config/validation.rs"]
#[allow(dead_code)]
pub mod validation;

/// `src/logging.rs`: the log level check that the configuration file's `logLevel` uses.
#[path = "../../src/logging.rs"]
#[allow(dead_code)]
pub mod logging;

/// `src/backend/winparse.rs`: parsers of what the Windows APIs return.
#[path = "../../src/backend/winparse.rs"]
#[allow(dead_code)]
pub mod winparse;

pub mod bytes;
