//! The instance names of the Windows GPU performance counters.
//!
//! PDH names each instance of the `GPU Engine`, `GPU Process Memory` and `GPU Adapter Memory`
//! counter sets after what it measures:
//!
//! - `GPU Engine`: `pid_<pid>_luid_0x<high>_0x<low>_phys_<n>_eng_<n>_engtype_<type>`
//! - `GPU Process Memory`: `pid_<pid>_luid_0x<high>_0x<low>_phys_<n>`
//! - `GPU Adapter Memory`: `luid_0x<high>_0x<low>_phys_<n>`
//!
//! The LUID is the adapter's (DXCore `InstanceLuid`), the physical index tells the GPUs of a
//! linked adapter apart. The engine type is the driver's name for the engine (`3D`, `Copy`,
//! `VideoDecode`, `Compute_0`, `Cuda`, `High Priority 3D`, or empty) and becomes an `engine`
//! label by [`engine_label`].

/// A parsed `GPU Engine` instance name (borrowing the engine type from the name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInstance<'a> {
    /// The process.
    pub pid: u32,
    /// The adapter.
    pub luid: i64,
    /// The physical GPU of a linked adapter (0 for an ordinary one).
    pub phys: u32,
    /// The engine's index on the GPU.
    pub eng: u32,
    /// The driver's engine type name, as reported (may be empty).
    pub engtype: &'a str,
}

/// A parsed `GPU Process Memory` instance name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessInstance {
    /// The process.
    pub pid: u32,
    /// The adapter.
    pub luid: i64,
    /// The physical GPU of a linked adapter.
    pub phys: u32,
}

/// A parsed `GPU Adapter Memory` instance name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdapterInstance {
    /// The adapter.
    pub luid: i64,
    /// The physical GPU of a linked adapter.
    pub phys: u32,
}

/// Reads `prefix` and then a decimal number ending at `_` or the end; returns it and the rest
/// (without the `_`).
fn number<'a>(text: &'a str, prefix: &str) -> Option<(u32, &'a str)> {
    let rest = text.strip_prefix(prefix)?;
    let end = rest.find('_').unwrap_or(rest.len());
    let digits = &rest[..end];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = digits.parse().ok()?;
    let rest = &rest[end..];
    Some((n, rest.strip_prefix('_').unwrap_or(rest)))
}

/// Reads `0x<hex>` ending at `_` or the end.
fn hex32(text: &str) -> Option<(u32, &str)> {
    let rest = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))?;
    let end = rest.find('_').unwrap_or(rest.len());
    let digits = &rest[..end];
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n = u32::from_str_radix(digits, 16).ok()?;
    let rest = &rest[end..];
    Some((n, rest.strip_prefix('_').unwrap_or(rest)))
}

/// Reads `luid_0x<high>_0x<low>` and returns the LUID as DXCore's signed 64-bit value.
fn luid(text: &str) -> Option<(i64, &str)> {
    let rest = text.strip_prefix("luid_")?;
    let (high, rest) = hex32(rest)?;
    let (low, rest) = hex32(rest)?;
    Some((luid_value(high, low), rest))
}

/// `HighPart << 32 | LowPart` as a signed 64-bit value (how dxdp stores a LUID).
pub fn luid_value(high: u32, low: u32) -> i64 {
    ((u64::from(high) << 32) | u64::from(low)) as i64
}

/// A LUID the way the counter instance names write it: `0x<high>_0x<low>`, eight upper-case hex
/// digits each (the `luid` label of the telemetry metrics).
pub fn luid_label(luid: i64) -> String {
    crate::luid::label(luid)
}

/// Parses a `GPU Engine` instance name; `None` when it does not have that shape.
pub fn parse_engine(name: &str) -> Option<EngineInstance<'_>> {
    let (pid, rest) = number(name, "pid_")?;
    let (luid, rest) = luid(rest)?;
    let (phys, rest) = number(rest, "phys_")?;
    let (eng, rest) = number(rest, "eng_")?;
    let engtype = rest.strip_prefix("engtype_")?;
    Some(EngineInstance {
        pid,
        luid,
        phys,
        eng,
        engtype,
    })
}

/// Parses a `GPU Process Memory` instance name; `None` when it does not have that shape.
pub fn parse_process(name: &str) -> Option<ProcessInstance> {
    let (pid, rest) = number(name, "pid_")?;
    let (luid, rest) = luid(rest)?;
    let (phys, rest) = number(rest, "phys_")?;
    rest.is_empty()
        .then_some(ProcessInstance { pid, luid, phys })
}

/// Parses a `GPU Adapter Memory` instance name; `None` when it does not have that shape.
pub fn parse_adapter(name: &str) -> Option<AdapterInstance> {
    let (luid, rest) = luid(name)?;
    let (phys, rest) = number(rest, "phys_")?;
    rest.is_empty().then_some(AdapterInstance { luid, phys })
}

/// The `engine` label of an engine type: without a trailing index (`Compute_1` is `compute`),
/// words split at case changes and separators, lower-case, joined by `_` (`VideoDecode` is
/// `video_decode`, `High Priority 3D` is `high_priority_3d`); `other` when nothing is left.
pub fn engine_label(engtype: &str) -> String {
    let trimmed = engtype.trim();
    // Drop a trailing index: `_<digits>` or ` <digits>`.
    let base = match trimmed.rfind(['_', ' ']) {
        Some(i)
            if i + 1 < trimmed.len() && trimmed[i + 1..].bytes().all(|b| b.is_ascii_digit()) =>
        {
            &trimmed[..i]
        }
        _ => trimmed,
    };
    let mut out = String::with_capacity(base.len() + 4);
    let mut previous: Option<char> = None;
    for c in base.chars() {
        if c.is_ascii_alphanumeric() {
            let boundary =
                c.is_ascii_uppercase() && previous.is_some_and(|p| p.is_ascii_lowercase());
            if boundary && !out.ends_with('_') {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('_') {
            out.push('_');
        }
        previous = Some(c);
    }
    while out.ends_with('_') {
        out.pop();
    }
    if out.is_empty() {
        "other".to_string()
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Instance names as a Windows Server 2022 node with an NVIDIA T4 and an Intel iGPU lists
    /// them (`typeperf -qx "GPU Engine"`), and what each must parse to.
    #[test]
    fn engine_instances_parse_to_pid_luid_phys_eng_and_type() {
        let table = [
            (
                "pid_1234_luid_0x00000000_0x0000D1A6_phys_0_eng_0_engtype_3D",
                (1234, 0xD1A6, 0, 0, "3D"),
            ),
            (
                "pid_4_luid_0x00000000_0x0000d1a6_phys_0_eng_5_engtype_VideoDecode",
                (4, 0xD1A6, 0, 5, "VideoDecode"),
            ),
            (
                "pid_10640_luid_0x00000001_0x0000F00D_phys_1_eng_12_engtype_Compute_1",
                (10640, 0x1_0000_F00D, 1, 12, "Compute_1"),
            ),
            (
                "pid_8_luid_0x00000000_0x006B8B86_phys_0_eng_3_engtype_",
                (8, 7_048_070, 0, 3, ""),
            ),
            (
                "pid_8_luid_0xFFFFFFFF_0xFFFFFFFF_phys_0_eng_3_engtype_High Priority 3D",
                (8, -1, 0, 3, "High Priority 3D"),
            ),
        ];
        for (name, (pid, luid, phys, eng, engtype)) in table {
            let got = parse_engine(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(
                (got.pid, got.luid, got.phys, got.eng, got.engtype),
                (pid, luid, phys, eng, engtype),
                "{name}"
            );
        }
    }

    #[test]
    fn malformed_instance_names_are_refused() {
        for name in [
            "",
            "_Total",
            "pid__luid_0x0_0x1_phys_0_eng_0_engtype_3D",
            "pid_12_luid_0x0_phys_0_eng_0_engtype_3D",
            "pid_12_luid_0x000000000_0x1_phys_0_eng_0_engtype_3D",
            "pid_12_luid_0xZZ_0x1_phys_0_eng_0_engtype_3D",
            "pid_12_luid_0x0_0x1_phys_0_eng_0",
            "pid_99999999999_luid_0x0_0x1_phys_0_eng_0_engtype_3D",
            "pid_-1_luid_0x0_0x1_phys_0_eng_0_engtype_3D",
        ] {
            assert_eq!(parse_engine(name), None, "{name}");
        }
        assert_eq!(parse_process("pid_1_luid_0x0_0x1_phys_0_eng_0"), None);
        assert_eq!(parse_adapter("luid_0x0_0x1_phys_0_part_0"), None);
        assert_eq!(parse_adapter("pid_1_luid_0x0_0x1_phys_0"), None);
    }

    #[test]
    fn memory_instances_parse() {
        assert_eq!(
            parse_process("pid_2024_luid_0x00000000_0x006B9126_phys_0"),
            Some(ProcessInstance {
                pid: 2024,
                luid: 7_049_510,
                phys: 0
            })
        );
        assert_eq!(
            parse_adapter("luid_0x00000000_0x006B9126_phys_1"),
            Some(AdapterInstance {
                luid: 7_049_510,
                phys: 1
            })
        );
    }

    #[test]
    fn luid_labels_are_written_as_the_instance_names_write_them() {
        assert_eq!(luid_label(7_048_070), "0x00000000_0x006B8B86");
        assert_eq!(luid_label(0x1_0000_F00D), "0x00000001_0x0000F00D");
        assert_eq!(luid_label(-1), "0xFFFFFFFF_0xFFFFFFFF");
        assert_eq!(luid_value(0xFFFF_FFFF, 0xFFFF_FFFF), -1);
    }

    #[test]
    fn engine_types_become_lower_case_labels() {
        let table = [
            ("3D", "3d"),
            ("Compute_0", "compute"),
            ("Compute_1", "compute"),
            ("Compute 0", "compute"),
            ("Copy", "copy"),
            ("VideoDecode", "video_decode"),
            ("VideoEncode", "video_encode"),
            ("VideoProcessing", "video_processing"),
            ("Video Decode", "video_decode"),
            ("LegacyOverlay", "legacy_overlay"),
            ("High Priority 3D", "high_priority_3d"),
            ("High Priority Compute", "high_priority_compute"),
            ("Cuda", "cuda"),
            ("Graphics_1", "graphics"),
            ("Timer 0", "timer"),
            ("VR", "vr"),
            ("", "other"),
            ("__", "other"),
            ("Security", "security"),
        ];
        for (engtype, label) in table {
            assert_eq!(engine_label(engtype), label, "{engtype:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_names_never_panic(name in "\\PC{0,80}") {
            let _ = parse_engine(&name);
            let _ = parse_process(&name);
            let _ = parse_adapter(&name);
            let label = engine_label(&name);
            proptest::prop_assert!(!label.is_empty());
            proptest::prop_assert!(label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
        }
    }
}
