//! Adapter LUIDs as dxdp writes them for people, and every way it reads them.
//!
//! One notation everywhere text shows a LUID (`discover`, `doctor`, `top`, `audit`, warnings,
//! logs, the `luid` label of the telemetry metrics): the one Windows' GPU performance counters use
//! in their instance names, `0x<HighPart>_0x<LowPart>` with eight upper-case hex digits each, e.g.
//! `0x00000000_0x006B8B86`. Documents keep the LUID as the number DXCore reports (`luid` in
//! `discover -o json` and host snapshots, the signed 64-bit `(HighPart << 32) | LowPart`), and
//! `DXDP_ADAPTER_LUIDS` gives applications that number in decimal.

/// A LUID for people: `0x<high>_0x<low>`, eight upper-case hex digits each.
pub fn label(luid: i64) -> String {
    let bits = luid as u64;
    format!("0x{:08X}_0x{:08X}", bits >> 32, bits & 0xFFFF_FFFF)
}

/// Reads a LUID written as [`label`] writes it (`0x00000000_0x006B8B86`), as `0xHIGH:0xLOW`,
/// as one `0x` hex number, or as the signed 64-bit decimal number. `None` for anything else.
pub fn parse(text: &str) -> Option<i64> {
    let t = text.trim();
    let hex = |s: &str| {
        let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
        (!digits.is_empty() && digits.len() <= 16)
            .then(|| u64::from_str_radix(digits, 16).ok())
            .flatten()
    };
    if let Some((high, low)) = t.split_once(['_', ':']) {
        let (high, low) = (hex(high)?, hex(low)?);
        let (high, low) = (u32::try_from(high).ok()?, u32::try_from(low).ok()?);
        return Some(((u64::from(high) << 32) | u64::from(low)) as i64);
    }
    if let Some(v) = hex(t) {
        return Some(v as i64);
    }
    t.parse::<i64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_the_counter_instance_notation() {
        assert_eq!(label(7_048_070), "0x00000000_0x006B8B86");
        assert_eq!(label(0x1_0000_F00D), "0x00000001_0x0000F00D");
        assert_eq!(label(-1), "0xFFFFFFFF_0xFFFFFFFF");
    }

    #[test]
    fn every_notation_reads_back() {
        for text in [
            "0x00000000_0x006B8B86",
            "0x00000000:0x006B8B86",
            "0x006b8b86",
            "0X6B8B86",
            "7048070",
            " 7048070 ",
        ] {
            assert_eq!(parse(text), Some(7_048_070), "{text}");
        }
        assert_eq!(parse("0xFFFFFFFF_0xFFFFFFFF"), Some(-1));
        assert_eq!(parse("-1"), Some(-1));
        assert_eq!(parse("0x00000001_0x0000F00D"), Some(0x1_0000_F00D));
        for bad in [
            "",
            "0x",
            "luid",
            "0x1_",
            "_0x1",
            "0x100000000_0x0",
            "1_2",
            "0x1_0x2_0x3",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
