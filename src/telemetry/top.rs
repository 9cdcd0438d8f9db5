//! What `dxdp top` shows: the figures as a table for people, and the figures read back from a
//! running daemon's `/metrics` text (so that `top` and Prometheus see the same samples; the
//! reading itself is [`super::scrape`]).

use std::collections::BTreeMap;

use dxdp_core::telemetry::compute::{
    ContainerTelemetry, DeviceTelemetry, Holder, Segments, TelemetryView,
};
use dxdp_core::telemetry::sensors::{ClockFigure, Figure, SensorSource, SensorView};
use dxdp_core::telemetry::PodRef;

/// Label names and values.
type Labels = Vec<(String, String)>;

/// The labels and value of one sample line, or `None` for comments and lines of other shapes.
fn sample_line(line: &str) -> Option<(&str, Labels, f64)> {
    if line.starts_with('#') || line.is_empty() {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, labels) = match series.find('{') {
        Some(i) => (&series[..i], series[i + 1..].strip_suffix('}')?),
        None => (series, ""),
    };
    Some((name, parse_labels(labels)?, value))
}

/// `a="x",b="y\"z"` into pairs, with the text format's escapes undone.
fn parse_labels(text: &str) -> Option<Labels> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let eq = rest.find("=\"")?;
        let key = rest[..eq].trim_start_matches(',').to_string();
        let mut value = String::new();
        let mut chars = rest[eq + 2..].char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return None,
                },
                '"' => {
                    end = Some(eq + 2 + i + 1);
                    break;
                }
                c => value.push(c),
            }
        }
        out.push((key, value));
        rest = rest[end?..].trim_start_matches(',');
    }
    Some(out)
}

fn label<'a>(labels: &'a [(String, String)], key: &str) -> &'a str {
    labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

/// The figures in a daemon's `/metrics` text (the `dxdp_gpu_*` and `dxdp_container_gpu_*`
/// series); devices in the order of `dxdp_gpu_info`.
pub fn view_from_metrics(text: &str) -> TelemetryView {
    let mut view = TelemetryView::default();
    let mut containers: BTreeMap<(PodRef, String), ContainerTelemetry> = BTreeMap::new();
    let lines: Vec<_> = text.lines().filter_map(sample_line).collect();
    for (name, labels, _) in &lines {
        if *name == "dxdp_gpu_info" {
            view.devices.push(DeviceTelemetry {
                device: label(labels, "device").into(),
                resource: label(labels, "resource").into(),
                luid: label(labels, "luid").into(),
                model: label(labels, "model").into(),
                engines: BTreeMap::new(),
                memory_used: Segments::default(),
                memory_total: Segments::default(),
                processes: 0,
                holders: Vec::new(),
                health: String::new(),
                sensors: SensorView::default(),
            });
        }
    }
    let segment = |s: &mut Segments, which: &str, v: f64| match which {
        "dedicated" => s.dedicated = Some(v as u64),
        "shared" => s.shared = Some(v as u64),
        _ => {}
    };
    for (name, labels, value) in &lines {
        let device = label(labels, "device");
        let pod = || PodRef {
            namespace: label(labels, "namespace").into(),
            pod: label(labels, "pod").into(),
            container: label(labels, "container").into(),
        };
        if let Some(rest) = name.strip_prefix("dxdp_container_gpu_") {
            let entry = containers
                .entry((pod(), device.to_string()))
                .or_insert_with(|| ContainerTelemetry {
                    pod: pod(),
                    device: device.into(),
                    memory_used: Segments::default(),
                    memory_share: None,
                    engines: BTreeMap::new(),
                    processes: 0,
                });
            match rest {
                "memory_used_bytes" => {
                    segment(&mut entry.memory_used, label(labels, "segment"), *value)
                }
                "memory_share_bytes" => entry.memory_share = Some(*value as u64),
                "processes" => entry.processes = *value as u64,
                "engine_utilization_ratio" => {
                    entry.engines.insert(label(labels, "engine").into(), *value);
                }
                _ => {}
            }
            continue;
        }
        let Some(d) = view.devices.iter_mut().find(|d| d.device == device) else {
            continue;
        };
        match *name {
            "dxdp_gpu_engine_utilization_ratio" => {
                d.engines.insert(label(labels, "engine").into(), *value);
            }
            "dxdp_gpu_memory_used_bytes" => {
                segment(&mut d.memory_used, label(labels, "segment"), *value)
            }
            "dxdp_gpu_memory_total_bytes" => {
                segment(&mut d.memory_total, label(labels, "segment"), *value)
            }
            "dxdp_gpu_processes" => d.processes = *value as u64,
            sensor if sensor_series(&mut d.sensors, sensor, labels, *value) => {}
            "dxdp_device_health" if *value == 1.0 => d.health = label(labels, "reason").into(),
            "dxdp_gpu_allocation" => d.holders.push(Holder {
                pod: pod(),
                resource: label(labels, "resource").into(),
                device_id: String::new(),
            }),
            _ => {}
        }
    }
    view.containers = containers.into_values().collect();
    for d in &mut view.devices {
        d.sensors.clocks.sort_by(|a, b| a.domain.cmp(&b.domain));
        d.sensors.throttle_reasons.sort();
    }
    view
}

/// The source a sensor series names (`None`: a value this `top` does not know).
fn source_of(labels: &[(String, String)]) -> Option<SensorSource> {
    match label(labels, "source") {
        "nvml" => Some(SensorSource::Nvml),
        "d3dkmt" => Some(SensorSource::D3dkmt),
        "dxcore" => Some(SensorSource::Dxcore),
        _ => None,
    }
}

/// Reads one sensor series (`dxdp_gpu_temperature_celsius`, ...) into `sensors`; false when
/// `name` is no sensor series or its source is unknown.
fn sensor_series(sensors: &mut SensorView, name: &str, labels: &Labels, value: f64) -> bool {
    let Some(source) = source_of(labels) else {
        return false;
    };
    let figure = Some(Figure { value, source });
    let clock = |sensors: &mut SensorView| -> usize {
        let domain = label(labels, "domain");
        match sensors.clocks.iter().position(|c| c.domain == domain) {
            Some(i) => i,
            None => {
                sensors.clocks.push(ClockFigure {
                    domain: domain.into(),
                    hertz: 0.0,
                    max_hertz: None,
                    source,
                });
                sensors.clocks.len() - 1
            }
        }
    };
    match name {
        "dxdp_gpu_temperature_celsius" => sensors.temperature_celsius = figure,
        "dxdp_gpu_temperature_margin_celsius" => sensors.temperature_margin_celsius = figure,
        "dxdp_gpu_power_ratio" => sensors.power_ratio = figure,
        "dxdp_gpu_power_watts" => sensors.power_watts = figure,
        "dxdp_gpu_power_limit_watts" => sensors.power_limit_watts = figure,
        "dxdp_gpu_fan_rpm" => sensors.fan_rpm = figure,
        "dxdp_gpu_clock_hertz" => {
            let i = clock(sensors);
            sensors.clocks[i].hertz = value;
        }
        "dxdp_gpu_clock_max_hertz" => {
            let i = clock(sensors);
            sensors.clocks[i].max_hertz = Some(value);
        }
        "dxdp_gpu_throttled" if value == 1.0 => {
            sensors
                .throttle_reasons
                .push(label(labels, "reason").into());
            sensors.throttle_source = Some(source);
        }
        _ => return false,
    }
    true
}

/// Whether the attribution behind a daemon's `/metrics` is current: its gauge
/// `dxdp_telemetry_attribution_current` (the last sample had current answers of PodResources,
/// HCS and CRI). From a daemon without that gauge: false when every one of its PodResources
/// calls failed (the holders are then empty for want of an answer, not because no pod holds a
/// GPU).
pub fn allocations_known_in_metrics(text: &str) -> bool {
    let mut calls = (0.0, 0.0);
    let mut current = None;
    for (name, labels, value) in text.lines().filter_map(sample_line) {
        if name == "dxdp_telemetry_attribution_current" {
            current = Some(value == 1.0);
        } else if name == "dxdp_telemetry_pod_resources_calls_total" {
            match label(&labels, "result") {
                "ok" => calls.0 += value,
                "error" => calls.1 += value,
                _ => {}
            }
        }
    }
    current.unwrap_or(!(calls.0 == 0.0 && calls.1 > 0.0))
}

/// A share as a whole percentage.
fn percent(v: f64) -> String {
    format!("{:.0}%", (v * 100.0).clamp(0.0, 100.0))
}

/// Bytes as GiB with one decimal.
fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 30) as f64)
}

/// The engines, busiest first (`3d 51% video_decode 25%`); `idle` when all are at 0, `-` when
/// unknown.
fn engines_text(engines: &BTreeMap<String, f64>) -> String {
    if engines.is_empty() {
        return "-".into();
    }
    let mut busy: Vec<(&String, &f64)> = engines.iter().filter(|(_, v)| **v >= 0.005).collect();
    if busy.is_empty() {
        return "idle".into();
    }
    busy.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
    busy.iter()
        .map(|(k, v)| format!("{k} {}", percent(**v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The temperature (`71.5°C`), or `-`.
fn temperature_text(s: &SensorView) -> String {
    s.temperature_celsius
        .map_or("-".into(), |t| format!("{:.1}°C", t.value))
}

/// The margin to the warning temperature (`11.5°C`), or `-`.
fn margin_text(s: &SensorView) -> String {
    s.temperature_margin_celsius
        .map_or("-".into(), |t| format!("{:.1}°C", t.value))
}

/// Power in watts with the limit (`182.5/300.0 W`), else the share of the limit (`61%`), or `-`.
fn power_text(s: &SensorView) -> String {
    match (s.power_watts, s.power_limit_watts, s.power_ratio) {
        (Some(w), Some(l), _) => format!("{:.1}/{:.1} W", w.value, l.value),
        (Some(w), None, _) => format!("{:.1} W", w.value),
        (None, _, Some(r)) => percent(r.value),
        (None, _, None) => "-".into(),
    }
}

/// A container's dedicated memory against its share: `3.0 of 2.0 GiB share, over` or
/// `1.5 of 2.0 GiB share`.
pub(super) fn share_text(used: u64, share: u64) -> String {
    let over = if used > share { ", over" } else { "" };
    format!("{} of {} GiB share{over}", gib(used), gib(share))
}

fn memory_text(used: &Segments, total: &Segments) -> String {
    match (used.dedicated, total.dedicated) {
        (Some(u), Some(t)) => format!("{}/{} GiB", gib(u), gib(t)),
        (Some(u), None) => format!("{} GiB", gib(u)),
        (None, Some(t)) => format!("-/{} GiB", gib(t)),
        (None, None) => "-".into(),
    }
}

pub(super) fn pod_text(p: &PodRef) -> String {
    if p.is_host() {
        "(host)".into()
    } else {
        format!("{}/{}/{}", p.namespace, p.pod, p.container)
    }
}

/// Left-aligned columns separated by two spaces ([`crate::output::table`]).
pub(super) fn table(rows: &[Vec<String>]) -> String {
    crate::output::table(rows)
}

/// The table `dxdp top` prints: one line per device, then one per container with processes on a
/// device.
pub fn text(view: &TelemetryView) -> String {
    if view.devices.is_empty() {
        return "No devices with telemetry.\n".into();
    }
    // The health column only when a daemon told it (`dxdp_device_health`).
    let with_health = view.devices.iter().any(|d| !d.health.is_empty());
    // The sensor columns only when some device reports a sensor.
    let with_sensors = view.devices.iter().any(|d| !d.sensors.is_empty());
    let mut rows = vec![vec![
        "DEVICE".to_string(),
        "MODEL".into(),
        "UTILISATION".into(),
        "MEMORY".into(),
        "PROCS".into(),
        "PODS".into(),
    ]];
    if with_sensors {
        rows[0].extend(["TEMP".to_string(), "MARGIN".into(), "POWER".into()]);
    }
    if with_health {
        rows[0].push("HEALTH".into());
    }
    for d in &view.devices {
        let mut pods: Vec<String> = d.holders.iter().map(|h| pod_text(&h.pod)).collect();
        pods.dedup();
        rows.push(vec![
            d.device.clone(),
            d.model.clone(),
            engines_text(&d.engines),
            memory_text(&d.memory_used, &d.memory_total),
            d.processes.to_string(),
            if pods.is_empty() {
                "-".into()
            } else {
                pods.join(", ")
            },
        ]);
        if with_sensors {
            if let Some(row) = rows.last_mut() {
                row.extend([
                    temperature_text(&d.sensors),
                    margin_text(&d.sensors),
                    power_text(&d.sensors),
                ]);
            }
        }
        if with_health {
            let health = if d.health.is_empty() { "-" } else { &d.health };
            if let Some(row) = rows.last_mut() {
                row.push(health.to_string());
            }
        }
    }
    let mut out = table(&rows);
    if !view.containers.is_empty() {
        let mut rows = vec![vec![
            "POD".to_string(),
            "DEVICE".into(),
            "UTILISATION".into(),
            "MEMORY".into(),
            "PROCS".into(),
        ]];
        // The share column only when some container holds memory units.
        let with_share = view.containers.iter().any(|c| c.memory_share.is_some());
        if with_share {
            rows[0].insert(4, "SHARE".into());
        }
        for c in &view.containers {
            let mut row = vec![
                pod_text(&c.pod),
                c.device.clone(),
                engines_text(&c.engines),
                memory_text(&c.memory_used, &Segments::default()),
                if c.processes == 0 {
                    "-".into()
                } else {
                    c.processes.to_string()
                },
            ];
            if with_share {
                let share = match (c.memory_share, c.memory_used.dedicated) {
                    (Some(s), Some(u)) if u > s => format!("{} GiB, over", gib(s)),
                    (Some(s), _) => format!("{} GiB", gib(s)),
                    (None, _) => "-".into(),
                };
                row.insert(4, share);
            }
            rows.push(row);
        }
        out.push('\n');
        out.push_str(&table(&rows));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_health_reason_comes_from_the_daemon_and_gets_a_column() {
        let text = "dxdp_gpu_info{device=\"a\",resource=\"r\",luid=\"1\",model=\"T4\"} 1\n\
dxdp_gpu_info{device=\"b\",resource=\"r\",luid=\"2\",model=\"T4\"} 1\n\
dxdp_device_health{device=\"a\",resource=\"r\",reason=\"tdr\"} 1\n\
dxdp_device_health{device=\"b\",resource=\"r\",reason=\"healthy\"} 1\n";
        let view = view_from_metrics(text);
        let health: Vec<&str> = view.devices.iter().map(|d| d.health.as_str()).collect();
        assert_eq!(health, ["tdr", "healthy"]);
        let table = super::text(&view);
        assert!(table.lines().next().unwrap().ends_with("HEALTH"), "{table}");
        assert!(table.lines().nth(1).unwrap().ends_with("tdr"), "{table}");
        // Without the daemon's gauge (a local sample): no column.
        let view = view_from_metrics(&text.lines().take(2).collect::<Vec<_>>().join("\n"));
        assert!(!super::text(&view).contains("HEALTH"));
    }

    #[test]
    fn memory_shares_read_back_and_get_a_column_beside_the_use() {
        let text = "dxdp_gpu_info{device=\"a\",resource=\"r\",luid=\"1\",model=\"T4\"} 1\n\
dxdp_container_gpu_memory_used_bytes{namespace=\"n\",pod=\"p\",container=\"c\",device=\"a\",segment=\"dedicated\"} 3221225472\n\
dxdp_container_gpu_memory_share_bytes{namespace=\"n\",pod=\"p\",container=\"c\",device=\"a\"} 2147483648\n\
dxdp_container_gpu_memory_used_bytes{namespace=\"n\",pod=\"q\",container=\"c\",device=\"a\",segment=\"dedicated\"} 1073741824\n";
        let view = view_from_metrics(text);
        let shares: Vec<Option<u64>> = view.containers.iter().map(|c| c.memory_share).collect();
        assert_eq!(shares, [Some(2 << 30), None]);
        let table = super::text(&view);
        let lines: Vec<&str> = table.lines().map(str::trim_end).collect();
        assert_eq!(
            lines[3..],
            [
                "POD    DEVICE  UTILISATION  MEMORY   SHARE          PROCS",
                "n/p/c  a       -            3.0 GiB  2.0 GiB, over  -",
                "n/q/c  a       -            1.0 GiB  -              -",
            ],
            "{table}"
        );
        assert_eq!(share_text(1 << 30, 2 << 30), "1.0 of 2.0 GiB share");
    }

    #[test]
    fn sensor_series_read_back_and_show_in_columns() {
        let text = "dxdp_gpu_info{device=\"a\",resource=\"r\",luid=\"1\",model=\"T4\"} 1\n\
dxdp_gpu_info{device=\"b\",resource=\"r\",luid=\"2\",model=\"T4\"} 1\n\
dxdp_gpu_temperature_celsius{device=\"a\",resource=\"r\",luid=\"1\",source=\"nvml\"} 71\n\
dxdp_gpu_temperature_margin_celsius{device=\"a\",resource=\"r\",luid=\"1\",source=\"d3dkmt\"} 11.5\n\
dxdp_gpu_power_watts{device=\"a\",resource=\"r\",luid=\"1\",source=\"nvml\"} 182.5\n\
dxdp_gpu_power_limit_watts{device=\"a\",resource=\"r\",luid=\"1\",source=\"nvml\"} 300\n\
dxdp_gpu_clock_max_hertz{device=\"a\",resource=\"r\",luid=\"1\",domain=\"graphics\",source=\"nvml\"} 2100000000\n\
dxdp_gpu_clock_hertz{device=\"a\",resource=\"r\",luid=\"1\",domain=\"graphics\",source=\"nvml\"} 1695000000\n\
dxdp_gpu_throttled{device=\"a\",resource=\"r\",luid=\"1\",reason=\"sw_power_cap\",source=\"nvml\"} 1\n\
dxdp_gpu_power_ratio{device=\"b\",resource=\"r\",luid=\"2\",source=\"d3dkmt\"} 0.25\n\
dxdp_gpu_fan_rpm{device=\"b\",resource=\"r\",luid=\"2\",source=\"martian\"} 1\n";
        let view = view_from_metrics(text);
        let a = &view.devices[0].sensors;
        assert_eq!(
            a.temperature_celsius,
            Some(Figure {
                value: 71.0,
                source: SensorSource::Nvml
            })
        );
        assert_eq!(a.temperature_margin_celsius.map(|f| f.value), Some(11.5));
        assert_eq!(
            a.clocks,
            vec![ClockFigure {
                domain: "graphics".into(),
                hertz: 1_695_000_000.0,
                max_hertz: Some(2_100_000_000.0),
                source: SensorSource::Nvml
            }]
        );
        assert_eq!(a.throttle_reasons, ["sw_power_cap"]);
        let b = &view.devices[1].sensors;
        assert_eq!(b.power_ratio.map(|f| f.value), Some(0.25));
        assert_eq!(b.fan_rpm, None, "an unknown source is not read");
        let table = super::text(&view);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].ends_with("TEMP    MARGIN  POWER"), "{table}");
        assert!(
            lines[1].ends_with("71.0°C  11.5°C  182.5/300.0 W"),
            "{table}"
        );
        assert!(lines[2].ends_with("-       -       25%"), "{table}");
    }

    #[test]
    fn labels_with_escapes_parse() {
        let (name, labels, value) =
            sample_line(r#"dxdp_gpu_info{device="a",model="x \"y\" \\ z",luid=""} 1"#).unwrap();
        assert_eq!(name, "dxdp_gpu_info");
        assert_eq!(value, 1.0);
        assert_eq!(
            labels,
            vec![
                ("device".to_string(), "a".to_string()),
                ("model".into(), r#"x "y" \ z"#.into()),
                ("luid".into(), String::new()),
            ]
        );
        assert!(sample_line("# TYPE x gauge").is_none());
        assert!(sample_line(r#"x{a="unterminated} 1"#).is_none());
        assert_eq!(sample_line("x 2.5").map(|s| s.2), Some(2.5));
    }

    #[test]
    fn engines_show_busiest_first_idle_or_unknown() {
        let e = |pairs: &[(&str, f64)]| -> BTreeMap<String, f64> {
            pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
        };
        assert_eq!(
            engines_text(&e(&[("copy", 0.1), ("3d", 0.51), ("cuda", 0.0)])),
            "3d 51% copy 10%"
        );
        assert_eq!(engines_text(&e(&[("3d", 0.0)])), "idle");
        assert_eq!(engines_text(&e(&[])), "-");
    }
}
