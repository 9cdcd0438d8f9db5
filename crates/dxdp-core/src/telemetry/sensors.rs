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
///
/// The order is the precedence of [`view`]: NVML first (the vendor's own figures, in watts and
/// whole degrees), then the graphics kernel, then DXCore.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
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

/// One figure of a device and the source it came from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Figure {
    /// The value, in the unit the field's name says.
    pub value: f64,
    /// The source that reported it.
    pub source: SensorSource,
}

/// One clock domain's figure.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClockFigure {
    /// The domain (`graphics`, `memory`, `sm`, `video`, ...).
    pub domain: String,
    /// The current frequency, hertz.
    pub hertz: f64,
    /// The domain's highest frequency, hertz, when the same source reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_hertz: Option<f64>,
    /// The source that reported it.
    pub source: SensorSource,
}

/// A device's sensor figures at the latest sample: one value per figure, each from the first
/// source by precedence (nvml, d3dkmt, dxcore) that reports it. A figure no source reports is
/// `None` (or empty), never 0.
#[derive(Debug, Clone, Default, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SensorView {
    /// The GPU's temperature, degrees Celsius.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_celsius: Option<Figure>,
    /// The warning temperature (where throttling begins) minus the current one, degrees
    /// Celsius, both from one source (the first that reports both); negative when over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_margin_celsius: Option<Figure>,
    /// Power draw as a share of the adapter's limit, 0 to 1 (D3DKMT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_ratio: Option<Figure>,
    /// Power draw, watts (NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_watts: Option<Figure>,
    /// The enforced power limit, watts (NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_watts: Option<Figure>,
    /// Fan speed, revolutions per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fan_rpm: Option<Figure>,
    /// Clock frequencies, one per domain, sorted by domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clocks: Vec<ClockFigure>,
    /// Why the clocks are held down, by name (NVML's clock event reasons), sorted; empty: none
    /// named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle_reasons: Vec<String>,
    /// The source that named the throttle reasons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle_source: Option<SensorSource>,
}

impl SensorView {
    /// Whether no figure is known.
    pub fn is_empty(&self) -> bool {
        *self == SensorView::default()
    }
}

/// The figures of one adapter from its readings (any order, any sources; of a source listed
/// twice the first counts): each figure from the first source by precedence that reports it.
/// A zero (a hand-edited snapshot's; the readers never record one) is not a reading.
/// The margin is the warning temperature minus the current one of the first source that
/// reports both; the throttle reasons are the first source's that names any.
pub fn view<'a>(readings: impl IntoIterator<Item = &'a AdapterSensors>) -> SensorView {
    let mut by_source: Vec<&AdapterSensors> = Vec::new();
    for r in readings {
        if !by_source.iter().any(|b| b.source == r.source) {
            by_source.push(r);
        }
    }
    by_source.sort_by_key(|r| r.source);
    fn first(
        by_source: &[&AdapterSensors],
        get: impl Fn(&AdapterSensors) -> Option<f64>,
    ) -> Option<Figure> {
        by_source.iter().find_map(|r| {
            get(r).map(|value| Figure {
                value,
                source: r.source,
            })
        })
    }
    let deci = |v: u32| f64::from(v) / 10.0;
    let mut out = SensorView {
        temperature_celsius: first(&by_source, |r| {
            r.temperature_decidegrees.and_then(nonzero).map(deci)
        }),
        temperature_margin_celsius: first(&by_source, |r| {
            match (
                r.temperature_warning_decidegrees.and_then(nonzero),
                r.temperature_decidegrees.and_then(nonzero),
            ) {
                (Some(w), Some(t)) => Some((f64::from(w) - f64::from(t)) / 10.0),
                _ => None,
            }
        }),
        power_ratio: first(&by_source, |r| {
            r.power_permille
                .and_then(nonzero)
                .map(|p| f64::from(p) / 1000.0)
        }),
        power_watts: first(&by_source, |r| {
            r.power_milliwatts
                .and_then(nonzero)
                .map(|p| p as f64 / 1000.0)
        }),
        power_limit_watts: first(&by_source, |r| {
            r.power_limit_milliwatts
                .and_then(nonzero)
                .map(|p| p as f64 / 1000.0)
        }),
        fan_rpm: first(&by_source, |r| r.fan_rpm.and_then(nonzero).map(f64::from)),
        clocks: Vec::new(),
        throttle_reasons: Vec::new(),
        throttle_source: None,
    };
    for r in &by_source {
        for c in &r.clocks {
            if c.hertz == 0 || out.clocks.iter().any(|k| k.domain == c.domain) {
                continue;
            }
            out.clocks.push(ClockFigure {
                domain: c.domain.clone(),
                hertz: c.hertz as f64,
                max_hertz: c.max_hertz.filter(|m| *m > 0).map(|m| m as f64),
                source: r.source,
            });
        }
    }
    out.clocks.sort_by(|a, b| a.domain.cmp(&b.domain));
    if let Some(r) = by_source.iter().find(|r| !r.throttle_reasons.is_empty()) {
        out.throttle_reasons = r.throttle_reasons.clone();
        out.throttle_reasons.sort();
        out.throttle_reasons.dedup();
        out.throttle_source = Some(r.source);
    }
    out
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

    fn nvidia_nvml() -> AdapterSensors {
        let mut s = AdapterSensors::new(7, SensorSource::Nvml);
        s.temperature_decidegrees = Some(710);
        s.power_milliwatts = Some(182_500);
        s.power_limit_milliwatts = Some(300_000);
        s.clocks = vec![
            ClockReading {
                domain: "graphics".into(),
                hertz: 1_695_000_000,
                max_hertz: Some(2_100_000_000),
            },
            ClockReading {
                domain: "sm".into(),
                hertz: 1_695_000_000,
                max_hertz: None,
            },
        ];
        s.throttle_reasons = vec!["sw_power_cap".into(), "hw_slowdown".into()];
        s
    }

    fn nvidia_d3dkmt() -> AdapterSensors {
        let mut s = AdapterSensors::new(7, SensorSource::D3dkmt);
        s.temperature_decidegrees = Some(715);
        s.temperature_warning_decidegrees = Some(830);
        s.temperature_max_decidegrees = Some(930);
        s.power_permille = Some(608);
        s.fan_rpm = Some(1450);
        s.clocks = vec![
            ClockReading {
                domain: "graphics".into(),
                hertz: 1_680_000_000,
                max_hertz: Some(1_980_000_000),
            },
            ClockReading {
                domain: "memory".into(),
                hertz: 7_001_000_000,
                max_hertz: None,
            },
        ];
        s
    }

    #[test]
    fn each_figure_comes_from_the_first_source_that_reports_it() {
        let dxcore = {
            let mut s = AdapterSensors::new(7, SensorSource::Dxcore);
            s.temperature_decidegrees = Some(700);
            s.fan_rpm = Some(9999);
            s
        };
        // Any order in, precedence out.
        let v = view([&dxcore, &nvidia_d3dkmt(), &nvidia_nvml()]);
        let f = |value: f64, source| Some(Figure { value, source });
        use SensorSource::*;
        assert_eq!(v.temperature_celsius, f(71.0, Nvml));
        // NVML has no warning temperature here: the margin is D3DKMT's 83.0 - 71.5.
        assert_eq!(v.temperature_margin_celsius, f(11.5, D3dkmt));
        assert_eq!(v.power_ratio, f(0.608, D3dkmt));
        assert_eq!(v.power_watts, f(182.5, Nvml));
        assert_eq!(v.power_limit_watts, f(300.0, Nvml));
        assert_eq!(v.fan_rpm, f(1450.0, D3dkmt));
        assert_eq!(
            v.clocks,
            vec![
                ClockFigure {
                    domain: "graphics".into(),
                    hertz: 1_695_000_000.0,
                    max_hertz: Some(2_100_000_000.0),
                    source: Nvml
                },
                ClockFigure {
                    domain: "memory".into(),
                    hertz: 7_001_000_000.0,
                    max_hertz: None,
                    source: D3dkmt
                },
                ClockFigure {
                    domain: "sm".into(),
                    hertz: 1_695_000_000.0,
                    max_hertz: None,
                    source: Nvml
                },
            ]
        );
        assert_eq!(v.throttle_reasons, ["hw_slowdown", "sw_power_cap"]);
        assert_eq!(v.throttle_source, Some(Nvml));
    }

    #[test]
    fn what_no_source_reports_is_absent_and_a_margin_needs_both_temperatures() {
        assert!(view([]).is_empty());
        let mut only_warning = AdapterSensors::new(1, SensorSource::D3dkmt);
        only_warning.temperature_warning_decidegrees = Some(900);
        let v = view([&only_warning]);
        assert!(v.is_empty(), "{v:?}");
        // Over the warning temperature: a negative margin.
        let mut hot = only_warning.clone();
        hot.temperature_decidegrees = Some(925);
        let v = view([&hot]);
        assert_eq!(
            v.temperature_margin_celsius,
            Some(Figure {
                value: -2.5,
                source: SensorSource::D3dkmt
            })
        );
        assert_eq!(v.power_ratio, None);
        assert_eq!(v.fan_rpm, None);
        // A recorded zero is no reading either.
        let mut zero = hot.clone();
        zero.fan_rpm = Some(0);
        zero.power_permille = Some(0);
        assert_eq!(view([&zero]), v);
        assert!(v.clocks.is_empty() && v.throttle_reasons.is_empty());
        // A source listed twice: the first counts.
        let mut again = hot.clone();
        again.temperature_decidegrees = Some(100);
        assert_eq!(
            view([&hot, &again]).temperature_celsius.map(|f| f.value),
            Some(92.5)
        );
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
