//! Windows event-log records as `EvtRender(EvtRenderEventXml)` returns them, turned into fault
//! events (pure; the subscription is the Windows backend's thin shim).
//!
//! Only the parts of Microsoft's event schema (`http://schemas.microsoft.com/win/2004/08/events/event`)
//! dxdp needs are read: `System/Provider/@Name`, `System/EventID`, `System/TimeCreated/@SystemTime`,
//! `System/Channel` and the `EventData/Data` values in order. The reader is a small scanner, not a
//! general XML parser: rendered events are machine-written, and anything it does not understand is
//! an error naming what is missing, never a panic.

use super::{FaultTarget, GpuFault, Reason};

/// The fields of one rendered event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    /// `System/Provider/@Name` (`Display`, `Windows Error Reporting`).
    pub provider: String,
    /// `System/EventID`.
    pub event_id: u32,
    /// `System/TimeCreated/@SystemTime`, in milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// `System/Channel` (`System`, `Application`).
    pub channel: String,
    /// `System/EventRecordID`: the record's number in its channel (what tells two records of
    /// one channel apart); absent when the rendering has none.
    pub record_id: Option<u64>,
    /// `EventData/Data` values in order, entities decoded.
    pub data: Vec<String>,
}

/// Reads one rendered event. Says which part is missing or malformed.
pub fn parse(xml: &str) -> Result<EventRecord, String> {
    let system = between(xml, "<System>", "</System>").ok_or("no <System> element")?;
    let provider = attribute(system, "Provider", "Name").ok_or("no System/Provider/@Name")?;
    let event_id = element_text(system, "EventID")
        .ok_or("no System/EventID")?
        .trim()
        .parse::<u32>()
        .map_err(|_| "System/EventID is not a number".to_string())?;
    let time = attribute(system, "TimeCreated", "SystemTime")
        .ok_or("no System/TimeCreated/@SystemTime")?;
    let time_ms = parse_time(&time).ok_or_else(|| {
        format!(
            "System/TimeCreated/@SystemTime {} is not an ISO 8601 UTC time",
            crate::quote::quote(&time)
        )
    })?;
    let channel = element_text(system, "Channel").unwrap_or_default();
    let record_id = element_text(system, "EventRecordID").and_then(|t| t.trim().parse().ok());
    let mut data = Vec::new();
    if let Some(body) = between(xml, "<EventData>", "</EventData>") {
        let mut rest = body;
        while let Some(start) = rest.find("<Data") {
            let after = &rest[start + 5..];
            let Some(close) = after.find('>') else {
                return Err("an EventData/Data element is not closed".into());
            };
            if after[..close].ends_with('/') {
                data.push(String::new());
                rest = &after[close + 1..];
                continue;
            }
            let inner = &after[close + 1..];
            let Some(end) = inner.find("</Data>") else {
                return Err("an EventData/Data element has no end tag".into());
            };
            data.push(decode(&inner[..end]));
            rest = &inner[end + 7..];
        }
    }
    Ok(EventRecord {
        provider: decode(&provider),
        event_id,
        time_ms,
        channel: decode(&channel),
        record_id,
        data,
    })
}

/// The fault event a record is, if it is one dxdp knows: `Display` 4101 (a display driver reset,
/// naming the driver's service in the first data value) or `Windows Error Reporting` 1001 of a
/// `LiveKernelEvent` with code 117 (`VIDEO_TDR_TIMEOUT_DETECTED`) or 141
/// (`VIDEO_ENGINE_TIMEOUT_DETECTED`).
pub fn fault(record: &EventRecord) -> Option<GpuFault> {
    if record.provider.eq_ignore_ascii_case("Display") && record.event_id == 4101 {
        let driver = record.data.first().map(|d| d.trim()).unwrap_or_default();
        return Some(GpuFault {
            time_ms: record.time_ms,
            signal: Reason::Tdr,
            target: if driver.is_empty() {
                FaultTarget::Unknown
            } else {
                FaultTarget::Driver(driver.to_string())
            },
            detail: if driver.is_empty() {
                "a display driver stopped responding and was reset (event 4101)".into()
            } else {
                format!(
                    "display driver {} stopped responding and was reset (event 4101)",
                    crate::quote::quote(driver)
                )
            },
        });
    }
    if record
        .provider
        .eq_ignore_ascii_case("Windows Error Reporting")
        && record.event_id == 1001
    {
        let at = record.data.iter().position(|d| d == "LiveKernelEvent")?;
        // Fault bucket, bucket type, event name, response, CAB ID, then P1 (the code).
        let code = record.data.get(at + 3)?.trim().to_ascii_lowercase();
        let name = match code.as_str() {
            "117" => "VIDEO_TDR_TIMEOUT_DETECTED",
            "141" => "VIDEO_ENGINE_TIMEOUT_DETECTED",
            _ => return None,
        };
        return Some(GpuFault {
            time_ms: record.time_ms,
            signal: Reason::LiveKernelEvent,
            target: FaultTarget::Unknown,
            detail: format!("Windows Error Reporting filed LiveKernelEvent {code} ({name})"),
        });
    }
    None
}

/// How far the report ID of a WER 1001 record lies after its event name (`LiveKernelEvent`):
/// the event's insertion strings are fault bucket, bucket type, event name, response, cab ID,
/// P1 to P10, attached files, store path, analysis symbol, rechecking for solution, report ID,
/// report status (then, since Windows 8, hashed bucket and cab GUID): the report ID is the
/// 20th, 17 after the event name (the 3rd). Source: Microsoft's description of event 1001,
/// `WER_EL_BUCKET_LOG` ("Report Id: %20"), which also says the event is logged at every state
/// change of a report, so one report shows as several records.
const REPORT_ID_AFTER_NAME: usize = 17;

/// The Windows Error Reporting report a WER 1001 `LiveKernelEvent` record belongs to: its
/// report ID (a GUID), lowercase; `None` for any other record, or one whose report ID is
/// empty. Every state change of one report logs another 1001 with the same report ID, so a
/// report is counted once by it.
pub fn report_id(record: &EventRecord) -> Option<String> {
    if !(record
        .provider
        .eq_ignore_ascii_case("Windows Error Reporting")
        && record.event_id == 1001)
    {
        return None;
    }
    let at = record.data.iter().position(|d| d == "LiveKernelEvent")?;
    let id = record.data.get(at + REPORT_ID_AFTER_NAME)?.trim();
    (!id.is_empty()).then(|| id.to_ascii_lowercase())
}

/// Parses and classifies one rendered event: `Ok(None)` for an event dxdp does not use.
pub fn fault_from_xml(xml: &str) -> Result<Option<GpuFault>, String> {
    parse(xml).map(|r| fault(&r))
}

fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let end = text[start..].find(close)? + start;
    Some(&text[start..end])
}

/// The text of `<name ...>text</name>` in `scope`.
fn element_text(scope: &str, name: &str) -> Option<String> {
    let open = format!("<{name}");
    let mut rest = scope;
    loop {
        let at = rest.find(&open)?;
        let after = &rest[at + open.len()..];
        // `<EventID` must not match `<EventIDx`.
        if after.starts_with(['>', ' ', '/', '\t', '\n', '\r']) {
            let close = after.find('>')?;
            if after[..close].ends_with('/') {
                return Some(String::new());
            }
            let inner = &after[close + 1..];
            let end = inner.find(&format!("</{name}>"))?;
            return Some(inner[..end].to_string());
        }
        rest = after;
    }
}

/// The value of `attr` on the first `<element ...>` in `scope` (single or double quotes).
fn attribute(scope: &str, element: &str, attr: &str) -> Option<String> {
    let open = format!("<{element}");
    let mut rest = scope;
    loop {
        let at = rest.find(&open)?;
        let after = &rest[at + open.len()..];
        if after.starts_with([' ', '\t', '\n', '\r']) {
            let tag = &after[..after.find('>')?];
            let key = format!("{attr}=");
            let mut search = tag;
            while let Some(k) = search.find(&key) {
                let before_ok = k == 0 || search[..k].ends_with([' ', '\t', '\n', '\r']);
                let value = &search[k + key.len()..];
                let quote = value.chars().next()?;
                if before_ok && (quote == '\'' || quote == '"') {
                    let body = &value[1..];
                    let end = body.find(quote)?;
                    return Some(body[..end].to_string());
                }
                search = &search[k + key.len()..];
            }
            return None;
        }
        rest = after;
    }
}

/// Decodes the five predefined XML entities and numeric character references.
fn decode(text: &str) -> String {
    if !text.contains('&') {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let Some(semi) = tail.find(';').filter(|s| *s <= 10) else {
            out.push('&');
            rest = &tail[1..];
            continue;
        };
        let entity = &tail[1..semi];
        let ch = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            e if e.starts_with("#x") => u32::from_str_radix(&e[2..], 16)
                .ok()
                .and_then(char::from_u32),
            e if e.starts_with('#') => e[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match ch {
            Some(c) => {
                out.push(c);
                rest = &tail[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses `2026-11-25T21:40:12.5129385Z` (what `SystemTime` holds: UTC, up to 7 fraction digits)
/// into milliseconds since the Unix epoch.
pub fn parse_time(text: &str) -> Option<u64> {
    let t = text.trim().strip_suffix('Z')?;
    let (date, time) = t.split_once('T')?;
    let mut d = date.split('-');
    let y: i64 = d.next()?.parse().ok()?;
    let mo: u32 = d.next()?.parse().ok()?;
    let da: u32 = d.next()?.parse().ok()?;
    // Four-digit years from the epoch on: the arithmetic below cannot overflow.
    if d.next().is_some()
        || !(1970..=9999).contains(&y)
        || !(1..=12).contains(&mo)
        || !(1..=31).contains(&da)
    {
        return None;
    }
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut h = hms.split(':');
    let hh: u64 = h.next()?.parse().ok()?;
    let mm: u64 = h.next()?.parse().ok()?;
    let ss: u64 = h.next()?.parse().ok()?;
    if h.next().is_some() || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    if !frac.chars().all(|c| c.is_ascii_digit()) || frac.len() > 9 {
        return None;
    }
    let ms: u64 = format!("{frac:0<3}")[..3].parse().ok()?;
    let days = days_from_civil(y, mo, da);
    if days < 0 {
        return None;
    }
    Some(((days as u64 * 86_400) + hh * 3600 + mm * 60 + ss) * 1000 + ms)
}

/// Formats milliseconds since the epoch as `2026-11-25T21:40:12Z`.
pub fn format_time(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (the inverse of `days_from_civil`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_and_format() {
        // 2026-11-25 00:00 UTC is 1,795,564,800 s after the epoch (`date -u -d 2026-11-25 +%s`).
        assert_eq!(
            parse_time("2026-11-25T21:40:12.5129385Z"),
            Some((1_795_564_800 + 21 * 3600 + 40 * 60 + 12) * 1000 + 512)
        );
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_time("2026-11-25T21:40:12"), None, "no zone");
        assert_eq!(parse_time("2026-13-25T21:40:12Z"), None);
        assert_eq!(parse_time("x"), None);
        // A huge year overflowed the day count (a panic in debug builds, as fuzzing runs).
        assert_eq!(parse_time("9223372036854775807-01-01T00:00:00Z"), None);
        assert_eq!(parse_time("1969-12-31T23:59:59Z"), None);
        assert_eq!(
            parse_time("9999-12-31T23:59:59Z"),
            Some(253_402_300_799_000)
        );
        assert_eq!(
            format_time((1_795_564_800 + 21 * 3600 + 40 * 60 + 12) * 1000 + 999),
            "2026-11-25T21:40:12Z"
        );
        assert_eq!(format_time(0), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn entities_decode_and_broken_ones_stay() {
        assert_eq!(decode("a&amp;b&lt;&#x41;&#66;"), "a&b<AB");
        assert_eq!(decode("R&D &bogus; x"), "R&D &bogus; x");
    }

    #[test]
    fn malformed_records_say_what_is_missing() {
        assert_eq!(parse("<Event/>").unwrap_err(), "no <System> element");
        let no_time =
            "<Event><System><Provider Name='Display'/><EventID>4101</EventID></System></Event>";
        assert_eq!(
            parse(no_time).unwrap_err(),
            "no System/TimeCreated/@SystemTime"
        );
        let bad_id =
            "<Event><System><Provider Name='Display'/><EventID>x</EventID></System></Event>";
        assert_eq!(parse(bad_id).unwrap_err(), "System/EventID is not a number");
    }

    // Recorded as `EvtRender(EvtRenderEventXml)` returns them (one line, single quotes).
    const TDR: &str = include_str!("events/display-4101-nvlddmkm.xml");
    const TDR_UNKNOWN: &str = include_str!("events/display-4101-unknown-driver.xml");
    const WER_141: &str = include_str!("events/wer-1001-livekernelevent-141.xml");
    const SCM: &str = include_str!("events/scm-7036-not-a-fault.xml");

    #[test]
    fn a_display_driver_reset_names_its_driver() {
        let r = parse(TDR).unwrap();
        assert_eq!(r.provider, "Display");
        assert_eq!(r.event_id, 4101);
        assert_eq!(r.channel, "System");
        assert_eq!(r.record_id, Some(18233));
        assert_eq!(r.data, ["nvlddmkm", ""]);
        // 2026-11-25T21:40:12.512Z
        assert_eq!(r.time_ms, 1_795_642_812_512);
        let f = fault(&r).unwrap();
        assert_eq!(f.signal, Reason::Tdr);
        assert_eq!(f.target, FaultTarget::Driver("nvlddmkm".into()));
        assert_eq!(
            f.detail,
            "display driver \"nvlddmkm\" stopped responding and was reset (event 4101)"
        );
        let u = fault_from_xml(TDR_UNKNOWN).unwrap().unwrap();
        assert_eq!(u.target, FaultTarget::Driver("ContosoKmd".into()));
        assert_eq!(u.time_ms, 1_795_643_560_000);
    }

    #[test]
    fn a_live_kernel_event_report_is_read_from_its_problem_signature() {
        let r = parse(WER_141).unwrap();
        assert_eq!(r.provider, "Windows Error Reporting");
        assert_eq!(r.channel, "Application");
        assert_eq!(r.record_id, Some(40211));
        assert_eq!(r.data.len(), 23);
        assert_eq!(r.data[2], "LiveKernelEvent");
        assert_eq!(r.data[5], "141");
        assert!(r.data[15].contains(".dmp\r\n"), "{:?}", r.data[15]);
        let f = fault(&r).unwrap();
        assert_eq!(f.signal, Reason::LiveKernelEvent);
        assert_eq!(f.target, FaultTarget::Unknown);
        assert_eq!(f.time_ms, 1_795_642_819_041);
        assert!(f.detail.contains("VIDEO_ENGINE_TIMEOUT_DETECTED"));
        // The report it belongs to: the 20th value ("Report Id: %20").
        assert_eq!(
            report_id(&r).as_deref(),
            Some("0e7b1c55-3a52-4c1e-9a0d-5f1f2f0a6b21")
        );
        let sent = parse(include_str!("events/wer-1001-livekernelevent-141-sent.xml")).unwrap();
        assert_eq!(sent.record_id, Some(40217));
        assert_eq!(report_id(&sent), report_id(&r), "the same report, sent");
        let other = parse(include_str!("events/wer-1001-livekernelevent-117.xml")).unwrap();
        assert_eq!(
            report_id(&other).as_deref(),
            Some("5c2d9e41-0b7a-4f63-8e25-91ad4c6f3b08")
        );
        assert_eq!(
            fault(&other).unwrap().detail,
            "Windows Error Reporting filed LiveKernelEvent 117 (VIDEO_TDR_TIMEOUT_DETECTED)"
        );
        assert_eq!(report_id(&parse(TDR).unwrap()), None);
        let no_id = WER_141.replace(
            "<Data>0e7b1c55-3a52-4c1e-9a0d-5f1f2f0a6b21</Data>",
            "<Data> </Data>",
        );
        assert_eq!(report_id(&parse(&no_id).unwrap()), None);
        // Other live kernel codes (a USB or network watchdog) are not GPU faults.
        let other = WER_141.replace("<Data>141</Data>", "<Data>144</Data>");
        assert_eq!(fault_from_xml(&other).unwrap(), None);
    }

    #[test]
    fn other_events_are_not_faults() {
        let r = parse(SCM).unwrap();
        assert_eq!(r.provider, "Service Control Manager");
        assert_eq!(r.event_id, 7036);
        assert_eq!(r.data, ["Windows Update", "running"]);
        assert_eq!(fault(&r), None);
    }
}
