//! GPU sensor readings: temperature, its warning and maximum, power, clocks, fan and throttle
//! reasons, per adapter, as one source reported them at one sample.
//!
//! Three sources may report the same adapter: the graphics kernel (`D3DKMTQueryAdapterInfo`
//! with `KMTQAITYPE_ADAPTERPERFDATA`, `..._PERFDATACAPS` and `KMTQAITYPE_NODEPERFDATA`, WDDM 2.4
//! and later), DXCore's adapter state queries (newer builds) and NVIDIA's NVML (where the driver
//! ships `nvml.dll`). The Windows reader converts each to the units below; a value the source
//! does not report, or reports as zero (drivers leave unsupported fields at 0), is `None`, never
//! `Some(0)`. Like the rest of the telemetry facts, the serde derives are the host snapshot
//! format (`docs/host-snapshot.md`): unknown fields and wrong types are errors.

use serde::{Deserialize, Serialize};

/// Where a reading came from (the `source` label of the sensor metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SensorSource {
    /// NVIDIA's management library (`nvml.dll`), NVIDIA adapters only.
    Nvml,
    /// The graphics kernel's adapter performance data (`D3DKMTQueryAdapterInfo`).
    D3dkmt,
    /// DXCore's adapter state queries (`IDXCoreAdapter::QueryState`).
    Dxcore,
}

impl SensorSource {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SensorSource::Nvml => "nvml",
            SensorSource::D3dkmt => "d3dkmt",
            SensorSource::Dxcore => "dxcore",
        }
    }
}

/// One source's readings of one adapter at one sample. Every value is optional: `None` when the
/// source does not report it or reports zero.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdapterSensors {
    /// The adapter's LUID (as in `adapters[].luid`).
    pub luid: i64,
    /// Which source read these values.
    pub source: SensorSource,
    /// The GPU's temperature, tenths of a degree Celsius (D3DKMT `Temperature`; NVML's whole
    /// degrees times ten).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_decidegrees: Option<u32>,
    /// The temperature at which the GPU starts to throttle, tenths of a degree Celsius (D3DKMT
    /// `TemperatureWarning`; NVML's slowdown threshold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_warning_decidegrees: Option<u32>,
    /// The highest temperature the GPU is rated for, tenths of a degree Celsius (D3DKMT
    /// `TemperatureMax`; NVML's shutdown threshold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_max_decidegrees: Option<u32>,
    /// Power draw as a share of the adapter's limit, tenths of a percent (D3DKMT `Power`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_permille: Option<u32>,
    /// Power draw, milliwatts (NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_milliwatts: Option<u64>,
    /// The enforced power limit, milliwatts (NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_milliwatts: Option<u64>,
    /// Fan speed, revolutions per minute (D3DKMT `FanRPM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fan_rpm: Option<u32>,
    /// Clock frequencies, one per domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clocks: Vec<ClockReading>,
    /// Why the GPU's clocks are held down now, by name (NVML's clock event reasons:
    /// `sw_power_cap`, `hw_slowdown`, `sw_thermal_slowdown`, `hw_thermal_slowdown`,
    /// `hw_power_brake_slowdown`, ...); `idle` and `applications_clocks_setting` are not
    /// throttling and are not listed. Empty: none, or the source cannot tell.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle_reasons: Vec<String>,
}

impl AdapterSensors {
    /// A reading of `luid` by `source` with no values yet.
    pub fn new(luid: i64, source: SensorSource) -> Self {
        AdapterSensors {
            luid,
            source,
            temperature_decidegrees: None,
            temperature_warning_decidegrees: None,
            temperature_max_decidegrees: None,
            power_permille: None,
            power_milliwatts: None,
            power_limit_milliwatts: None,
            fan_rpm: None,
            clocks: Vec::new(),
            throttle_reasons: Vec::new(),
        }
    }
}

/// One clock domain's frequency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClockReading {
    /// The domain (the `domain` label): `graphics` (the 3D engine, or NVML's graphics clock),
    /// `compute`, `memory`, `sm` (NVML), `video` (NVML, or a video engine node).
    pub domain: String,
    /// The current frequency, hertz.
    pub hertz: u64,
    /// The domain's highest frequency without overclocking, hertz, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_hertz: Option<u64>,
}

/// A value as the sources report it: zero means "not reported" (drivers leave fields they do
/// not support at 0), so it becomes `None`.
pub fn nonzero<T: Default + PartialEq>(value: T) -> Option<T> {
    (value != T::default()).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_not_a_reading() {
        assert_eq!(nonzero(0u32), None);
        assert_eq!(nonzero(655u32), Some(655));
        assert_eq!(nonzero(0u64), None);
    }

    #[test]
    fn the_snapshot_form_is_camel_case_and_omits_what_is_unknown() {
        let mut s = AdapterSensors::new(53670, SensorSource::D3dkmt);
        s.temperature_decidegrees = Some(655);
        s.clocks.push(ClockReading {
            domain: "memory".into(),
            hertz: 7_000_000_000,
            max_hertz: None,
        });
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"luid":53670,"source":"d3dkmt","temperatureDecidegrees":655,"clocks":[{"domain":"memory","hertz":7000000000}]}"#
        );
        let back: AdapterSensors = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert!(serde_json::from_str::<AdapterSensors>(
            r#"{"luid":1,"source":"d3dkmt","temperature":3}"#
        )
        .is_err());
    }
}
