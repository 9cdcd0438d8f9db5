//! Pieces of the configuration file's JSON Schema ([`super::file::config_schema`]): the schemas
//! of the core crate's types (which know nothing of JSON Schema), and tidying the generated one.

use schemars::{json_schema, Schema, SchemaGenerator};
use serde_json::Value;

use dxdp_core::assignment::Assignment;
use dxdp_core::policy::{AllocationPolicy, MultiDevice};

/// Implements `JsonSchema` for the checked value type `$ty` as the inline schema `$schema` (the
/// object `json_schema!` takes).
macro_rules! inline_schema {
    ($ty:ident, $schema:tt) => {
        impl schemars::JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($ty).into()
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!($schema)
            }
        }
    };
}
pub(super) use inline_schema;

// Schemas of the core crate's types, and tidying.
fn one_of_or_null(names: Vec<&str>) -> Schema {
    let mut names: Vec<Value> = names.into_iter().map(Value::from).collect();
    names.push(Value::Null);
    json_schema!({"enum": names})
}

/// `assignment`.
pub(super) fn assignment(_: &mut SchemaGenerator) -> Schema {
    one_of_or_null(Assignment::ALL.iter().map(|a| a.as_str()).collect())
}

/// `allocationPolicy`.
pub(super) fn allocation_policy(_: &mut SchemaGenerator) -> Schema {
    one_of_or_null(AllocationPolicy::ALL.iter().map(|a| a.as_str()).collect())
}

/// `multiDevice`.
pub(super) fn multi_device(_: &mut SchemaGenerator) -> Schema {
    one_of_or_null(MultiDevice::ALL.iter().map(|a| a.as_str()).collect())
}

/// What [`super::MetricsAddress::parse`] accepts, so that the chart's schema refuses what the
/// daemon would (`localhost:9466`, a missing port): `IPv4:PORT` exactly (no leading zeros in
/// the address, a port up to 65535, leading zeros allowed), `[IPv6]:PORT` by its characters
/// (dxdp checks the rest), or empty (off); blanks around it are trimmed.
pub(super) fn socket_address(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": ["string", "null"],
        "pattern": SOCKET_ADDRESS_PATTERN,
    })
}

/// The pattern of `socket_address`.
pub(crate) const SOCKET_ADDRESS_PATTERN: &str = concat!(
    r"^\s*$|^\s*(",
    r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    r"|\[[0-9A-Fa-f:.]{2,45}(%[0-9]{1,10})?\]",
    r"):0*([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])\s*$"
);

/// `devices.include` and `devices.exclude`: lists of device selectors.
pub(super) fn selectors(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": ["array", "null"],
        "items": {
            "type": "object",
            "description": "a device selector: a device matches when every given field matches",
            "additionalProperties": false,
            "minProperties": 1,
            "properties": {
                "vendor": {
                    "type": ["string", "integer"],
                    "description": "a vendor name (nvidia, amd, intel, microsoft, qualcomm, or the manufacturer as Windows reports it), pci-XXXX or a PCI vendor ID such as 0x10DE"
                },
                "deviceId": {"type": "integer", "minimum": 0, "description": "PCI device ID"},
                "locationPath": {"type": "string", "description": "location path (case-insensitive)"},
                "description": {"type": "string", "description": "glob over the description (* and ?, case-insensitive)"}
            }
        }
    })
}

/// Drops what Helm's validators do not know (`format` names such as `uint32`).
pub(super) fn tidy(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("format").is_some_and(Value::is_string) {
                map.remove("format");
            }
            map.values_mut().for_each(tidy);
        }
        Value::Array(list) => list.iter_mut().for_each(tidy),
        _ => {}
    }
}
