//! Device IDs: stable names derived from the location path.
//!
//! LUIDs change on every reboot and instance IDs contain `\` and `&`, so a device's ID is a
//! readable slug of its location path plus a 64-bit FNV-1a hash of the (upper-cased) full path.
//! The same location path always gives the same ID, on every OS and every dxdp version that keeps
//! this function; IDs use only `[a-z0-9-]` and are at most [`MAX_ID_LEN`] characters long, which
//! leaves room for replica suffixes within the kubelet's 63-character limit.

/// The longest device ID this module produces.
pub const MAX_ID_LEN: usize = 56;

const HASH_HEX_LEN: usize = 16;
const MAX_SLUG_LEN: usize = MAX_ID_LEN - HASH_HEX_LEN - 1;

/// The device ID for a location path.
pub fn device_id(location_path: &str) -> String {
    let mut slug = String::new();
    let mut pending_dash = false;
    for ch in location_path.chars() {
        if ch.is_ascii_alphanumeric() {
            if pending_dash && !slug.is_empty() {
                slug.push('-');
            }
            pending_dash = false;
            slug.push(ch.to_ascii_lowercase());
        } else {
            pending_dash = true;
        }
        if slug.len() >= MAX_SLUG_LEN {
            break;
        }
    }
    slug.truncate(MAX_SLUG_LEN);
    let slug = slug.trim_end_matches('-');
    let slug = if slug.is_empty() { "device" } else { slug };
    let hash = fnv1a64(location_path.to_uppercase().as_bytes());
    format!("{slug}-{hash:0width$x}", width = HASH_HEX_LEN)
}

/// 64-bit FNV-1a: tiny, stable and specified, unlike `std`'s hashers.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Whether `id` is a valid kubelet device ID: 1 to 63 characters of `[A-Za-z0-9._-]`.
pub fn is_valid_kubelet_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_ids_never_change() {
        // These pin the algorithm: changing them breaks every running cluster's allocations.
        let table = [
            ("PCIROOT(0)#PCI(1B00)", "pciroot-0-pci-1b00-"),
            (
                "PCIROOT(0)#PCI(0100)#PCI(0000)",
                "pciroot-0-pci-0100-pci-0000-",
            ),
            ("", "device-"),
            ("###", "device-"),
            ("ACPI(_SB_)#ACPI(PCI0)", "acpi-sb-acpi-pci0-"),
        ];
        for (path, prefix) in table {
            let id = device_id(path);
            assert!(id.starts_with(prefix), "{path}: {id}");
            assert_eq!(id.len(), prefix.len() + 16, "{path}: {id}");
        }
        assert_eq!(
            device_id("PCIROOT(0)#PCI(1B00)"),
            "pciroot-0-pci-1b00-0540e5ad73bf260f"
        );
    }

    #[test]
    fn case_does_not_change_the_id() {
        assert_eq!(
            device_id("PCIROOT(0)#PCI(1B00)"),
            device_id("pciroot(0)#pci(1b00)")
        );
    }

    #[test]
    fn punctuation_differences_still_give_different_ids() {
        assert_ne!(device_id("PCI(1B00)"), device_id("PCI-1B00"));
    }

    #[test]
    fn kubelet_id_validation() {
        let long = "a".repeat(64);
        let table = [
            ("a", true),
            ("a.b_c-1", true),
            ("", false),
            ("a/b", false),
            (long.as_str(), false),
        ];
        for (id, ok) in table {
            assert_eq!(is_valid_kubelet_id(id), ok, "{id}");
        }
    }

    proptest! {
        #[test]
        fn ids_are_valid_and_stable(path in "\\PC{0,200}") {
            let id = device_id(&path);
            prop_assert!(is_valid_kubelet_id(&id), "{}", id);
            prop_assert!(id.len() <= MAX_ID_LEN);
            prop_assert_eq!(&id, &device_id(&path));
        }

        #[test]
        fn distinct_paths_give_distinct_ids(
            a in "(PCIROOT\\([0-9]\\)#PCI\\([0-9A-F]{4}\\)){1,4}",
            b in "(PCIROOT\\([0-9]\\)#PCI\\([0-9A-F]{4}\\)){1,4}",
        ) {
            prop_assume!(a.to_uppercase() != b.to_uppercase());
            prop_assert_ne!(device_id(&a), device_id(&b));
        }
    }
}
