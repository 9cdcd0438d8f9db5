//! A byte decoder that turns fuzz input into host facts: one GPU adapter with a driver key and
//! driver store, whose `CopyToVm*` registry keys and existing files come from the input. Every
//! input decodes to some facts, so the fuzzer spends its time in the pipeline, not in a parser.

use dxdp_core::facts::{
    AdapterFacts, Attribute, HardwareId, HostFacts, OsFacts, PnpFacts, RegData, RegType,
    RegistryKey, RegistryValue,
};

/// Reads the input front to back; past the end everything is zero or empty.
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    /// A string: a length byte, then that many bytes (lossy UTF-8). Short words from a small
    /// dictionary are mixed in so that paths look like real ones often enough.
    pub fn string(&mut self) -> String {
        const WORDS: [&str; 12] = [
            "nvcuda.dll",
            r"\SystemRoot\System32\",
            r"C:\Windows\System32\DriverStore\FileRepository\nv.inf_amd64_1",
            "..",
            r"\\server\share\",
            "/",
            r"\",
            "CON",
            "a.dll:stream",
            "%SystemRoot%",
            "System32",
            "",
        ];
        let len = self.byte();
        if len >= 0xF4 {
            return WORDS[usize::from(len - 0xF4)].to_string();
        }
        let n = usize::from(len).min(self.data.len());
        let (s, rest) = self.data.split_at(n);
        self.data = rest;
        String::from_utf8_lossy(s).into_owned()
    }
}

const DRIVER_KEY: &str = r"{4d36e968-e325-11ce-bfc1-08002be10318}\0001";
const STORE: &str = r"C:\Windows\System32\DriverStore\FileRepository\nv.inf_amd64_1";
const SUBKEYS: [&str; 5] = [
    "CopyToVmOverwrite",
    "CopyToVmWhenNewer",
    "CopyToVmOverwriteWow64",
    "CopyToVmWhenNewerWow64",
    "Other",
];
const KINDS: [RegType; 6] = [
    RegType::REG_SZ,
    RegType::REG_MULTI_SZ,
    RegType::REG_EXPAND_SZ,
    RegType::REG_DWORD,
    RegType::REG_BINARY,
    RegType::REG_QWORD,
];

/// Host facts decoded from fuzz input (see the module doc).
pub fn host_facts(data: &[u8]) -> HostFacts {
    let mut r = Reader::new(data);
    let flags = r.byte();
    let system_root = if flags & 1 == 1 {
        Some(r.string())
    } else {
        None
    };
    let store = if flags & 2 == 2 {
        r.string()
    } else {
        STORE.to_string()
    };
    let driver_key = if flags & 4 == 4 {
        r.string()
    } else {
        DRIVER_KEY.to_string()
    };
    let mut registry: Vec<RegistryKey> = Vec::new();
    let mut files: Vec<String> = Vec::new();
    while !r.is_empty() {
        let op = r.byte();
        match op % 4 {
            0 | 1 => {
                let subkey = SUBKEYS[usize::from(op / 4) % SUBKEYS.len()];
                let key =
                    format!(r"HKLM\SYSTEM\CurrentControlSet\Control\Class\{driver_key}\{subkey}");
                let name = r.string();
                let kind = KINDS[usize::from(r.byte()) % KINDS.len()];
                let data = match kind {
                    RegType::REG_MULTI_SZ => {
                        let n = r.byte() % 4;
                        RegData::Strings((0..n).map(|_| r.string()).collect())
                    }
                    RegType::REG_DWORD | RegType::REG_QWORD => RegData::Integer(r.byte().into()),
                    RegType::REG_BINARY => RegData::String("00ff".into()),
                    _ => RegData::String(r.string()),
                };
                let value = RegistryValue { name, kind, data };
                match registry.iter_mut().find(|k| k.key == key) {
                    Some(k) => k.values.push(value),
                    None => registry.push(RegistryKey {
                        key,
                        values: vec![value],
                    }),
                }
            }
            2 => {
                let name = r.string();
                files.push(format!(r"{store}\{name}"));
            }
            _ => files.push(r.string()),
        }
    }
    let mut adapter = AdapterFacts::minimal(
        1,
        vec![Attribute::D3D12_GRAPHICS, Attribute::D3D12_CORE_COMPUTE],
    );
    adapter.hardware_id = HardwareId {
        vendor_id: if flags & 8 == 8 { 0x1002 } else { 0x10DE },
        device_id: 0x2236,
        sub_sys_id: 0,
        revision: 0,
    };
    adapter.driver_store_path = Some(store);
    adapter.pnp = Some(PnpFacts {
        instance_id: r"PCI\VEN_10DE&DEV_2236\1".into(),
        location_paths: vec!["PCIROOT(0)#PCI(0100)#PCI(0000)".into()],
        driver_key: Some(driver_key),
        ..PnpFacts::default()
    });
    HostFacts {
        os: Some(OsFacts {
            system_root,
            ..OsFacts::default()
        }),
        adapters: vec![adapter],
        registry,
        files,
        faults: Vec::new(),
    }
}
